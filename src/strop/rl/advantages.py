"""GRPO's advantages and the choices around them, as pure tensor functions: no model, no I/O. Shapes: `_G` is one
group's samples, `_T` one sequence's positions. The losses these advantages feed are the engine's
(`strop.engine.losses`).

    adv_G = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]))    # [0.5, -0.5, -0.5, 0.5]
    is_zero_variance(torch.tensor([0.7, 0.7]))                       # True: such a group teaches nothing
    batch_advantages([r1_G, r2_G], "rloo")                           # each group's leave-one-out advantages
    aggregation_scales([3, 1], "sequence-mean")                      # [1/6, 1/2]: each sequence weighs alike
    overlong_penalty(90, max_tokens=100, buffer=20)                  # -0.5: DAPO's soft length penalty

The estimators (`advantageEstimator`) differ in the baseline a sample's reward is compared with: its group's
mean (GRPO), the mean of the group's *other* samples (RLOO, Ahmadian et al. 2024, arXiv 2402.14740), or the
group's mean with every advantage of the batch then divided by the batch's std (REINFORCE++, Hu et al. 2025,
arXiv 2501.03262).
"""

from __future__ import annotations

import torch

from strop.rl.loss_choices import ADVANTAGE_ESTIMATORS, LOSS_AGGREGATIONS


def group_advantages(rewards_G: torch.Tensor, scale_by_std: bool = False, eps: float = 1e-6) -> torch.Tensor:
    """GRPO's advantage: each sample's reward minus its group's mean (optionally over the group's std).

    We centre but do not scale by default: Dr. GRPO showed std scaling over-weights groups that are almost
    all right or all wrong, which biases learning towards easy and hopeless questions."""
    centred_G = rewards_G - rewards_G.mean()
    if scale_by_std:
        # population std: a group of identical rewards has std 0, and its centred advantages are 0 anyway
        centred_G = centred_G / (rewards_G.std(unbiased=False) + eps)
    return centred_G


def rloo_advantages(rewards_G: torch.Tensor) -> torch.Tensor:
    """RLOO: each reward minus the mean of the group's other rewards, r_i - (sum(r) - r_i) / (G - 1), which is
    G / (G - 1) times the group-mean advantage: a baseline that does not contain the sample itself, so the
    estimate is unbiased."""
    n = rewards_G.numel()
    return rewards_G - (rewards_G.sum() - rewards_G) / (n - 1)


def batch_advantages(rewards_by_group: list[torch.Tensor], estimator: str = "group-mean",
                     scale_by_std: bool = False, normalise_over: list[int] | None = None,
                     eps: float = 1e-6) -> list[torch.Tensor]:
    """Each group's advantages under `estimator`. reinforce++ centres each group on its mean, then divides
    every advantage by the std of the advantages of the groups in `normalise_over` (default: all; a step passes
    the groups it trains, since a dropped group's zeros would shrink the std)."""
    if estimator == "group-mean":
        return [group_advantages(r_G, scale_by_std) for r_G in rewards_by_group]
    if estimator == "rloo":
        return [rloo_advantages(r_G) for r_G in rewards_by_group]
    if estimator == "reinforce++":
        centred = [group_advantages(r_G) for r_G in rewards_by_group]
        chosen = range(len(centred)) if normalise_over is None else normalise_over
        pooled = torch.cat([centred[g] for g in chosen]) if chosen else torch.zeros(0)
        # population std over the batch, as a whitening; with one sample (or none) there is no spread to divide by
        std = float(pooled.std(unbiased=False)) if pooled.numel() > 1 else 0.0
        return [a_G / (std + eps) if std > 0 else a_G for a_G in centred]
    raise ValueError(f"unknown advantage estimator {estimator!r}; choose one of {', '.join(ADVANTAGE_ESTIMATORS)}")


def aggregation_scales(tokens_per_sequence: list[int], aggregation: str = "token-sum",
                       normalizer: float | None = None) -> list[float]:
    """What each sequence's summed loss is multiplied by, so that the update's loss is aggregated as named:

        token-sum      1 each (strop's loss before this setting: a long completion weighs more)
        token-mean     1 / (tokens of all sequences): every token weighs alike (DAPO, arXiv 2503.14476)
        sequence-mean  1 / (sequences x this sequence's tokens): every sequence weighs alike (the original GRPO)
        constant       1 / normalizer: neither the batch nor the length decides (Dr. GRPO, arXiv 2503.20783)

    The losses strop scales this way (importance_sampling, ppo, cispo) are positively homogeneous in the
    advantage, so multiplying a sequence's advantages by its scale multiplies its loss and gradient by it."""
    if aggregation == "token-sum":
        return [1.0] * len(tokens_per_sequence)
    if aggregation == "token-mean":
        total = sum(tokens_per_sequence)
        return [1.0 / total if total else 0.0] * len(tokens_per_sequence)
    if aggregation == "sequence-mean":
        n = len(tokens_per_sequence)
        return [1.0 / (n * t) if t else 0.0 for t in tokens_per_sequence]
    if aggregation == "constant":
        if not normalizer or normalizer <= 0:
            raise ValueError("constant aggregation needs a normalizer greater than 0")
        return [1.0 / normalizer] * len(tokens_per_sequence)
    raise ValueError(f"unknown loss aggregation {aggregation!r}; choose one of {', '.join(LOSS_AGGREGATIONS)}")


def overlong_penalty(tokens: int, max_tokens: int, buffer: int) -> float:
    """DAPO's soft overlong punishment for a completion of `tokens` tokens: 0 up to max_tokens - buffer, then
    falling linearly to -1 at max_tokens (a completion cut at the limit), the reward it is added to."""
    free = max_tokens - buffer
    if tokens <= free:
        return 0.0
    return max(-1.0, (free - tokens) / buffer)


def is_zero_variance(rewards_G: torch.Tensor, tol: float = 1e-9) -> bool:
    """True when every sample in the group scored the same: such a group gives no gradient."""
    return bool((rewards_G.max() - rewards_G.min()).abs() <= tol)


def kl_penalty(lp_T: torch.Tensor, base_lp_T: torch.Tensor) -> torch.Tensor:
    """Per-token estimate of KL(policy || base) on tokens sampled from the policy: log p - log p_base.
    Subtracting beta times this from the advantages penalises drifting from the base model."""
    return lp_T - base_lp_T
