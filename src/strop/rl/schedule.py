"""The learning rate of each step: the configured rate, after an optional linear warm-up.

    rate = warmed_up_rate(1e-4, step=0, warmup_steps=10)   # 1e-5: a tenth of the rate on the first step
"""

from __future__ import annotations


def warmed_up_rate(learning_rate: float, step: int, warmup_steps: int) -> float:
    """The learning rate of `step` (from 0) under a linear warm-up of `warmup_steps`: learning_rate x (step + 1) /
    warmup_steps during it (the first step already moves), the full rate from then on (and always with 0)."""
    if warmup_steps <= 0 or step + 1 >= warmup_steps:
        return learning_rate
    return learning_rate * (step + 1) / warmup_steps
