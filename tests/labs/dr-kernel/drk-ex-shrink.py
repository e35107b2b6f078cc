"""Exercise drk-ex-shrink: the closed-form shrink factor of turn-level GRPO."""

import numpy as np
from scipy import stats

OK_FORMAT = False
name = "drk-ex-shrink"
points = 2


def test_matches_the_binomial_sum(shrink_factor):
    for K, a in ((2, 0.5), (4, 0.25), (9, 0.7), (16, 0.05)):
        n = np.arange(K + 1)
        exact = np.sum(stats.binom.pmf(n, K, a) * np.maximum(n - 1, 0)) / (K * a)
        assert abs(float(shrink_factor(K, a)) - exact) < 1e-10, (K, a)


def test_limits(shrink_factor):
    assert abs(float(shrink_factor(5, 1.0)) - 0.8) < 1e-12
    assert float(shrink_factor(5, 1e-9)) < 1e-6
