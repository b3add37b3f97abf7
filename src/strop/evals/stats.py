"""Statistics for comparing two models on the same items: is the difference real?

    from strop.evals.stats import mcnemar_exact, paired_bootstrap_ci, cohens_kappa, win_tie_loss
    p = mcnemar_exact(b=7, c=106)                      # b: right only for A, c: right only for B
    low, high = paired_bootstrap_ci(correct_a, correct_b, seed=0)   # 95% interval of accuracy(B) - accuracy(A)

Pure functions, no I/O; tests check them against values worked out by hand.
"""

from __future__ import annotations

import math
import random
from collections import Counter


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value. Under "no difference" the b + c discordant pairs split 50/50, so
    p = 2 * P(Binomial(b + c, 1/2) <= min(b, c)), capped at 1."""
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be >= 0, got b={b}, c={c}")
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def discordant(correct_a: list[bool], correct_b: list[bool]) -> tuple[int, int]:
    """(b, c): items only A got right, items only B got right."""
    _same_length(correct_a, correct_b)
    b = sum(a and not bb for a, bb in zip(correct_a, correct_b))
    c = sum(bb and not a for a, bb in zip(correct_a, correct_b))
    return b, c


def paired_bootstrap_ci(values_a: list[float], values_b: list[float], *, resamples: int = 10_000,
                        level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile interval of mean(B) - mean(A), resampling items (pairs stay together)."""
    _same_length(values_a, values_b)
    n = len(values_a)
    if n == 0:
        raise ValueError("no items to compare")
    diffs = [float(b) - float(a) for a, b in zip(values_a, values_b)]
    rng = random.Random(seed)
    means = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    tail = (1 - level) / 2
    return means[int(math.floor(tail * (resamples - 1)))], means[int(math.ceil((1 - tail) * (resamples - 1)))]


def cohens_kappa(labels_a: list, labels_b: list) -> float:
    """Agreement of two raters beyond chance: (p_observed - p_chance) / (1 - p_chance). 1 when they always
    agree; 0 when they agree as often as chance would; NaN when chance agreement is already total."""
    _same_length(labels_a, labels_b)
    n = len(labels_a)
    if n == 0:
        raise ValueError("no items to compare")
    observed = sum(a == b for a, b in zip(labels_a, labels_b)) / n
    count_a, count_b = Counter(labels_a), Counter(labels_b)
    chance = sum(count_a[k] * count_b[k] for k in count_a) / n ** 2
    return float("nan") if chance == 1 else (observed - chance) / (1 - chance)


def win_tie_loss(scores_a: list[float], scores_b: list[float]) -> dict[str, int]:
    """Per item: B wins when its score is higher, ties when equal, loses when lower."""
    _same_length(scores_a, scores_b)
    out = {"win": 0, "tie": 0, "loss": 0}
    for a, b in zip(scores_a, scores_b):
        out["win" if b > a else "loss" if b < a else "tie"] += 1
    return out


def _same_length(a, b) -> None:
    if len(a) != len(b):
        raise ValueError(f"paired statistics need the same items for both models: got {len(a)} and {len(b)}")
