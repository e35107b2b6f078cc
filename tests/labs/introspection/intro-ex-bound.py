"""Exercise intro-ex-bound: the exact FPR bound after zero false positives."""

import pytest
from scipy import stats

OK_FORMAT = False
name = "intro-ex-bound"
points = 2


def test_bound_matches_beta_quantile(fpr_upper_bound):
    for n in (1, 20, 200, 1000):
        for level in (0.05, 0.01):
            assert abs(fpr_upper_bound(n, level) - stats.beta.ppf(1 - level, 1, n)) < 1e-10


def test_controls_needed_is_smallest(fpr_upper_bound, controls_needed):
    for bound in (0.01, 0.015, 0.05):
        n = controls_needed(bound)
        assert fpr_upper_bound(n) <= bound < fpr_upper_bound(n - 1)
    with pytest.raises(ValueError):
        controls_needed(1.5)
    with pytest.raises(ValueError):
        fpr_upper_bound(0)
