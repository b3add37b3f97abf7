"""Completions cut at max_completion_length, as the `overlong` setting treats them (DAPO, arXiv 2503.14476):
keep them, mask them from the loss (overlong filtering), or add a soft length penalty to their reward.

    overlong.masked(rollout, config)     # True: leave this rollout out of the update
    overlong.penalty(rollout, config)    # <= 0: added to the reward its advantage compares

A rollout of several turns is judged by its longest turn: each turn has the limit of its own.
"""

from __future__ import annotations

from strop.rl.advantages import overlong_penalty
from strop.rl.loss_choices import overlong_buffer
from strop.rl.types import Rollout


def cut(rollout: Rollout) -> bool:
    """Some turn of the rollout stopped at the token limit."""
    return any(t.stop_reason == "length" for t in rollout.turns)


def masked(rollout: Rollout, config) -> bool:
    return config.overlong == "mask" and cut(rollout)


def penalty(rollout: Rollout, config) -> float:
    if config.overlong != "soft-penalty" or not rollout.turns:
        return 0.0
    longest = max(len(t.tokens) for t in rollout.turns)
    return overlong_penalty(longest, config.max_completion_length, overlong_buffer(config))
