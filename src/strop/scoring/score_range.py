"""The range a score may take: a finite number with |score| <= MAX_ABS_SCORE. Anything else is a grader's error.

    >>> score_problem(0.5) is None
    True
    >>> score_problem(1e39)
    '1e+39, outside the range a score may take (a finite number from -1,000,000 to 1,000,000)'

Why a range and not just "finite": a grader returning 1e39 is finite as a Python float, but a step's rewards are
float32 (3.4e38 at most), so that one score became infinity, its group's mean infinity, every advantage NaN and
every adapter weight NaN. A reward term's weight is at most 1,000 (`strop.rl.limits`), so a term contributes at most
1e9 to a reward: far inside float32, and its square (the group's variance, with scale_by_std) too. No honest grader
needs more than a million; its scores are compared only within a group, so rescale them if it does.
"""

from __future__ import annotations

import math

MAX_ABS_SCORE = 1e6
SCORE_RANGE = f"a finite number from -{MAX_ABS_SCORE:,.0f} to {MAX_ABS_SCORE:,.0f}"


def score_problem(value: float) -> str | None:
    """None for a score in range, else what is wrong with it (for a grader error)."""
    if not math.isfinite(value):
        return repr(value)
    if abs(value) > MAX_ABS_SCORE:
        return f"{value!r}, outside the range a score may take ({SCORE_RANGE})"
    return None
