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

from dataclasses import dataclass


@dataclass(frozen=True)
class Loss:
    inputs: tuple[str, ...]  # the loss_fn_inputs each datum carries, each as long as its model input
    policy: bool             # a policy-gradient loss (sampler logprobs and advantages), not a supervised one
    summary: str


LOSSES: dict[str, Loss] = {
    "cross_entropy": Loss(("target_tokens", "weights"), False, "supervised: -sum(weights * log p)"),
    "importance_sampling": Loss(("target_tokens", "logprobs", "advantages"), True,
                                "REINFORCE with the sampler's importance weight: -sum(p/q * A)"),
    "ppo": Loss(("target_tokens", "logprobs", "advantages"), True,
                "PPO's clipped surrogate: -sum(min(r * A, clip(r) * A))"),
    "cispo": Loss(("target_tokens", "logprobs", "advantages"), True,
                  "CISPO: the clipped importance weight, gradient stopped, times A * log p"),
}
POLICY_LOSSES = tuple(name for name, loss in LOSSES.items() if loss.policy)


def sequence_loss(name: str, lp_T, inputs: dict, clip_low: float = 0.8, clip_high: float = 1.2):
    """(the loss `name` over one sequence, the positions a clip cut off or None); `inputs` holds the datum's
    loss_fn_inputs other than target_tokens, as tensors."""
    if name == "cross_entropy":
        return cross_entropy_loss(lp_T, inputs["weights"]), None
    old_T, adv_T = inputs["logprobs"], inputs["advantages"]
    if name == "importance_sampling":
        return importance_sampling_loss(lp_T, old_T, adv_T), None
    if name == "ppo":
        return ppo_loss(lp_T, old_T, adv_T, clip_low, clip_high)
    if name == "cispo":
        return cispo_loss(lp_T, old_T, adv_T, clip_low, clip_high), None
    raise ValueError(f"unknown loss {name!r}; the losses are {', '.join(LOSSES)}")


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


def kl_sample_train(old_T, lp_T):
    """Mean of (sampler logprob - trainer logprob) over the given tokens: an estimate of KL(sampler || trainer).
    Near 0 on-policy; it grows when sampler and trainer disagree (stale weights, precision, a bug)."""
    return (old_T - lp_T).mean()
