"""GRPO's advantages as pure tensor functions: no model, no I/O. Shapes: `_G` is one group's samples, `_T` one
sequence's positions. The losses these advantages feed are the engine's (`strop.engine.losses`).

    adv_G = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]))    # [0.5, -0.5, -0.5, 0.5]
    is_zero_variance(torch.tensor([0.7, 0.7]))                       # True: such a group teaches nothing
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


def kl_penalty(lp_T: torch.Tensor, base_lp_T: torch.Tensor) -> torch.Tensor:
    """Per-token estimate of KL(policy || base) on tokens sampled from the policy: log p - log p_base.
    Subtracting beta times this from the advantages penalises drifting from the base model."""
    return lp_T - base_lp_T
