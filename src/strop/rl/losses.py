"""Policy-gradient losses and advantages as pure tensor functions: no model, no I/O.

Shapes: `_T` is one sequence's positions, `_G` one group's samples. Every loss is a *sum* over the positions
it is given (as Tinker's are), so callers pass only the positions that count or zero their advantages.

    lp_T   logprobs of the target tokens under the policy being trained (carries gradient)
    old_T  logprobs the sampler recorded for the same tokens (no gradient)
    adv_T  per-token advantages

    loss = importance_sampling_loss(lp_T, old_T, adv_T)           # -sum(exp(lp - old) * adv)
    loss, clipped = ppo_loss(lp_T, old_T, adv_T, 0.8, 1.2)
"""

import torch


def group_advantages(rewards_G: torch.Tensor, scale_by_std: bool = False, eps: float = 1e-6) -> torch.Tensor:
    """GRPO's advantage: each sample's reward minus its group's mean (optionally over the group's std).

    We centre but do not scale by default: Dr. GRPO showed std scaling over-weights groups that are almost
    all right or all wrong, which biases learning towards easy and hopeless questions."""
    centred_G = rewards_G - rewards_G.mean()
    if scale_by_std:
        # population std: a group of identical rewards has std 0, and its centred advantages are 0 anyway
        centred_G = centred_G / (rewards_G.std(unbiased=False) + eps)
    return centred_G


def is_zero_variance(rewards_G: torch.Tensor, tol: float = 1e-9) -> bool:
    """True when every sample in the group scored the same: such a group gives no gradient."""
    return bool((rewards_G.max() - rewards_G.min()).abs() <= tol)


def cross_entropy_loss(lp_T: torch.Tensor, weights_T: torch.Tensor) -> torch.Tensor:
    """Supervised loss: -sum(weights * logprob)."""
    return -(lp_T * weights_T).sum()


def importance_sampling_loss(lp_T: torch.Tensor, old_T: torch.Tensor, adv_T: torch.Tensor) -> torch.Tensor:
    """REINFORCE corrected for the sampler having been a different policy: -sum(p/q * A).

    Its gradient is -sum(p/q * A * grad log p), which on-policy (p == q) is the plain policy gradient."""
    ratio_T = torch.exp(lp_T - old_T)
    return -(ratio_T * adv_T).sum()


def ppo_loss(lp_T: torch.Tensor, old_T: torch.Tensor, adv_T: torch.Tensor,
             clip_low: float = 0.8, clip_high: float = 1.2) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate, summed: -sum(min(r * A, clip(r, low, high) * A)), r = p/q.

    Returns (loss, clipped_T) where clipped_T marks positions whose gradient the clip removed."""
    ratio_T = torch.exp(lp_T - old_T)
    unclipped_T = ratio_T * adv_T
    clipped_obj_T = ratio_T.clamp(clip_low, clip_high) * adv_T
    loss = -torch.minimum(unclipped_T, clipped_obj_T).sum()
    clipped_T = clipped_obj_T < unclipped_T
    return loss, clipped_T


def cispo_loss(lp_T: torch.Tensor, old_T: torch.Tensor, adv_T: torch.Tensor,
               clip_low: float = 0.8, clip_high: float = 1.2) -> torch.Tensor:
    """CISPO (MiniMax-M1): clip the importance weight, not the update, and stop its gradient:
    -sum(sg(clip(r, low, high)) * A * log p). Every token keeps a gradient, unlike PPO."""
    weight_T = torch.exp(lp_T - old_T).clamp(clip_low, clip_high).detach()
    return -(weight_T * adv_T * lp_T).sum()


def kl_sample_train(old_T: torch.Tensor, lp_T: torch.Tensor) -> torch.Tensor:
    """Mean of (sampler logprob - trainer logprob) over the given tokens: an estimate of KL(sampler || trainer).
    Near 0 on-policy; it grows when sampler and trainer disagree (stale weights, precision, a bug)."""
    return (old_T - lp_T).mean()


def kl_penalty(lp_T: torch.Tensor, base_lp_T: torch.Tensor) -> torch.Tensor:
    """Per-token estimate of KL(policy || base) on tokens sampled from the policy: log p - log p_base.
    Subtracting beta times this from the advantages penalises drifting from the base model."""
    return lp_T - base_lp_T
