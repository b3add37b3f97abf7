"""Comparison statistics against values worked out by hand."""

import math

import pytest

from strop.evals.stats import cohens_kappa, discordant, mcnemar_exact, paired_bootstrap_ci, win_tie_loss


def test_mcnemar_exact_by_hand():
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(3, 3) == 1.0                          # 2 * P(X <= 3 | n=6) = 2 * 42/64 > 1
    assert mcnemar_exact(0, 5) == pytest.approx(2 / 32)        # 2 * (1/2)^5
    assert mcnemar_exact(1, 5) == pytest.approx(2 * 7 / 64)    # 2 * (C(6,0) + C(6,1)) / 2^6
    assert mcnemar_exact(5, 1) == mcnemar_exact(1, 5)
    assert mcnemar_exact(7, 106) == pytest.approx(7.95e-24, rel=1e-2)  # the learning benchmark's pairs
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)


def test_discordant_pairs():
    assert discordant([True, True, False, False], [True, False, True, True]) == (1, 2)
    with pytest.raises(ValueError, match="same items"):
        discordant([True], [True, False])


def test_bootstrap_interval_brackets_the_difference():
    a = [0, 0, 1, 0, 1, 0, 0, 1, 0, 0] * 5       # 30%
    b = [1, 0, 1, 1, 1, 0, 1, 1, 0, 1] * 5       # 70%
    low, high = paired_bootstrap_ci(a, b, resamples=2000, seed=1)
    assert low < 0.4 < high and low > 0                    # the observed +40 points, clearly above 0
    assert paired_bootstrap_ci(a, a, resamples=500) == (0.0, 0.0)
    assert paired_bootstrap_ci(a, b, resamples=500, seed=3) == paired_bootstrap_ci(a, b, resamples=500, seed=3)


def test_cohens_kappa_by_hand():
    assert cohens_kappa([1, 0, 1, 0], [1, 0, 1, 0]) == 1.0
    # observed 0.5; chance: A says 1 half the time, B says 1 half the time -> 0.5; kappa 0
    assert cohens_kappa([1, 1, 0, 0], [1, 0, 1, 0]) == 0.0
    # observed 3/4; chance (3*2 + 1*2)/16 = 0.5; kappa (0.75 - 0.5) / 0.5 = 0.5
    assert cohens_kappa([1, 1, 1, 0], [1, 1, 0, 0]) == pytest.approx(0.5)
    assert math.isnan(cohens_kappa([1, 1], [1, 1]))


def test_win_tie_loss():
    assert win_tie_loss([1, 5, 3, 0], [2, 5, 1, 0]) == {"win": 1, "tie": 2, "loss": 1}
