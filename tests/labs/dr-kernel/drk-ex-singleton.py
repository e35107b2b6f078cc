"""Exercise drk-ex-singleton: GRPO whose lone rollouts keep no baseline."""

import numpy as np
from scipy import stats

OK_FORMAT = False
name = "drk-ex-singleton"
points = 3


def test_closed_form_against_the_binomial_sum(singleton_ratio):
    for K, a in ((2, 0.5), (4, 0.25), (8, 0.6)):
        n = np.arange(K + 1)
        pmf = stats.binom.pmf(n, K, a)
        exact = np.sum(pmf * (np.maximum(n - 1, 0) + (n == 1))) / (K * a)
        assert abs(float(singleton_ratio(K, a)) - exact) < 1e-10, (K, a)


def test_advantages(singleton_advantages):
    G = np.array([[1.0, 2.0, 4.0], [3.0, 5.0, 7.0]])
    valid = np.array([[True, False, False], [True, True, False]])
    adv = singleton_advantages(G, valid)
    assert np.allclose(adv, [[1.0, 0.0, 0.0], [-1.0, 1.0, 0.0]])
