"""The per-token losses of `forward_backward`, by name: pure tensor functions and the one registry of their names
and inputs that the trainer, the API types, the run configs and the command line read.

Shapes: `_T` is one sequence's positions. Every loss is a *sum* over the positions it is given (as Tinker's are),
so callers pass only the positions that count or zero their advantages (or weights).

    lp_T   logprobs of the target tokens under the policy being trained (carries gradient)
    old_T  logprobs the sampler recorded for the same tokens (no gradient)
    adv_T  per-token advantages

    loss = importance_sampling_loss(lp_T, old_T, adv_T)           # -sum(exp(lp - old) * adv)
    loss, clipped_T = sequence_loss("ppo", lp_T, {"logprobs": old_T, "advantages": adv_T}, 0.8, 1.2)
    LOSSES["cispo"].inputs                                          # ('target_tokens', 'logprobs', 'advantages')

The functions use tensor methods only, so importing this module costs nothing: configs and the command line
read `LOSSES` without loading torch. Advantages are the algorithm's, in `strop.rl.advantages`.
"""

from __future__ import annotations

import math

from strop.choices import LOSSES, POLICY_LOSSES, Loss  # noqa: F401 - the registry is a leaf's; callers find it here too

DRO_BETA = 0.05   # dro's default penalty weight (loss_fn_config {"beta": ...})




def sequence_loss(name: str, lp_T, inputs: dict, clip_low: float = 0.8, clip_high: float = 1.2,
                  tis_cap: float | None = None, beta: float = DRO_BETA, sequence_ratio: bool = False,
                  trained_T=None):
    """(the loss `name` over one sequence, the positions a clip cut off or None); `inputs` holds the datum's
    loss_fn_inputs other than target_tokens, as tensors. With `tis_cap`, truncated importance sampling
    (`tis_weights`): the sampler's logprobs give each token's weight and the loss's own ratio is taken against
    the trainer's. With `sequence_ratio` (GSPO), every trained position (`trained_T`, default: advantage not 0)
    weighs and clips the sequence's ratio instead of its own (`sequence_logprobs`)."""
    if name == "cross_entropy":
        return cross_entropy_loss(lp_T, inputs["weights"]), None
    old_T, adv_T = inputs["logprobs"], inputs["advantages"]
    if tis_cap is not None:
        adv_T = adv_T * tis_weights(lp_T, old_T, tis_cap)
        old_T = lp_T.detach()
    if sequence_ratio:
        if name == "dro":
            raise ValueError("dro has no importance ratio to take per sequence")
        lp_T = sequence_logprobs(lp_T, old_T, adv_T != 0 if trained_T is None else trained_T)
    if name == "importance_sampling":
        return importance_sampling_loss(lp_T, old_T, adv_T), None
    if name == "ppo":
        return ppo_loss(lp_T, old_T, adv_T, clip_low, clip_high)
    if name == "cispo":
        return cispo_loss(lp_T, old_T, adv_T, clip_low, clip_high), cispo_clipped(lp_T, old_T, clip_low, clip_high)
    if name == "dro":
        return dro_loss(lp_T, old_T, adv_T, beta), None
    raise ValueError(f"unknown loss {name!r}; the losses are {', '.join(LOSSES)}")


def sequence_logprobs(lp_T, old_T, trained_T):
    """GSPO (Zheng et al. 2025, arXiv 2507.18071): logprobs whose ratio to `old_T` is, at every position, the
    sequence's ratio s = exp(mean over the trained positions of (lp - old)), the geometric mean of the token
    ratios. A loss given these weighs and clips s, one number a sequence, and its gradient reaches each trained
    token through the mean (for cispo: clip(s) x A x each token's log-prob gradient, one weight a sequence)."""
    n = trained_T.sum().clamp(min=1)
    log_s = ((lp_T - old_T) * trained_T).sum() / n
    return old_T + log_s


def cross_entropy_loss(lp_T, weights_T):
    """Supervised loss: -sum(weights * logprob)."""
    return -(lp_T * weights_T).sum()


def importance_sampling_loss(lp_T, old_T, adv_T):
    """REINFORCE corrected for the sampler having been a different policy: -sum(p/q * A).

    Its gradient is -sum(p/q * A * grad log p), which on-policy (p == q) is the plain policy gradient."""
    ratio_T = (lp_T - old_T).exp()
    return -(ratio_T * adv_T).sum()


def ppo_loss(lp_T, old_T, adv_T, clip_low: float = 0.8, clip_high: float = 1.2):
    """PPO's clipped surrogate, summed: -sum(min(r * A, clip(r, low, high) * A)), r = p/q.

    Returns (loss, clipped_T) where clipped_T marks positions whose gradient the clip removed."""
    ratio_T = (lp_T - old_T).exp()
    unclipped_T = ratio_T * adv_T
    clipped_obj_T = ratio_T.clamp(clip_low, clip_high) * adv_T
    loss = -unclipped_T.minimum(clipped_obj_T).sum()
    clipped_T = clipped_obj_T < unclipped_T
    return loss, clipped_T


def cispo_loss(lp_T, old_T, adv_T, clip_low: float = 0.8, clip_high: float = 1.2):
    """CISPO (MiniMax-M1): clip the importance weight, not the update, and stop its gradient:
    -sum(sg(clip(r, low, high)) * A * log p). Every token keeps a gradient, unlike PPO."""
    weight_T = (lp_T - old_T).exp().clamp(clip_low, clip_high).detach()
    return -(weight_T * adv_T * lp_T).sum()


def cispo_clipped(lp_T, old_T, clip_low: float = 0.8, clip_high: float = 1.2):
    """The positions whose CISPO weight the clip changed."""
    ratio_T = (lp_T.detach() - old_T).exp()
    return (ratio_T < clip_low) | (ratio_T > clip_high)


def dro_loss(lp_T, old_T, adv_T, beta: float = 0.05):
    """Direct reward optimisation (Richemond et al. 2024; Kimi k1.5): -sum(A * log p - beta/2 * (log p - log q)^2).
    The quadratic term keeps the policy near the sampler's without a ratio, so the data may be off-policy."""
    return -(adv_T * lp_T - 0.5 * beta * (lp_T - old_T).square()).sum()


def tis_weights(lp_T, old_T, cap: float):
    """Truncated importance sampling (rollout correction): min(p_train / p_sampler, cap) per token, no gradient.

    The sampler and the trainer compute the same tokens' probabilities with different kernels (bf16 rounding, a
    vLLM engine), so the rollouts come from a slightly different policy than the one trained. Multiplying each
    token's advantage by this weight corrects for it, and the cap bounds the variance a rare token's large ratio
    would add. With it, the policy loss's own ratio is taken against the trainer's logprobs of the same weights
    (1 in value): its gradient is then sum(weight * A * grad log p)."""
    return (lp_T.detach() - old_T).exp().clamp(max=cap)


RATIO_BAND = (0.5, 2.0)  # a token whose p_train / p_sampler leaves this band is counted as mismatched


def ratio_stats(lp_T, old_T) -> tuple[float, float]:
    """(the largest |log p_sampler - log p_train|, the number of tokens whose ratio p_train / p_sampler is outside
    RATIO_BAND) over the given tokens: the tail that the mean (`kl_sample_train`) hides."""
    if lp_T.numel() == 0:
        return 0.0, 0.0
    diff_T = (lp_T.detach() - old_T).float()
    low, high = RATIO_BAND
    outside = ((diff_T < math.log(low)) | (diff_T > math.log(high))).sum()
    return float(diff_T.abs().max()), float(outside)


def kl_sample_train(old_T, lp_T):
    """Mean of (sampler logprob - trainer logprob) over the given tokens: an estimate of KL(sampler || trainer).
    Near 0 on-policy; it grows when sampler and trainer disagree (stale weights, precision, a bug)."""
    return (old_T - lp_T).mean()
