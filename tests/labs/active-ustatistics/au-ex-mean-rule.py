"""Exercise au-ex-mean-rule: the variance-minimising inclusion rule for the mean."""

import numpy as np

from icml26 import active_ustatistics as au

OK_FORMAT = False
name = "au-ex-mean-rule"
points = 3


def test_is_the_water_filling_rule(mean_rule, rng):
    for size, budget in [(200, 20), (50, 30), (400, 5)]:
        sd = rng.gamma(0.5, size=size)
        pi = mean_rule(sd, budget)
        assert abs(pi.sum() - budget) <= 1e-6 * budget, f"probabilities must sum to {budget}"
        assert np.all((pi > 0) & (pi <= 1)), "inclusion probabilities must lie in (0, 1]"
        assert np.allclose(pi, au.water_filling(sd, budget), atol=1e-6), "not the optimal rule"


def test_beats_uniform_and_random_rules(mean_rule, rng):
    sd = rng.gamma(1.0, size=300)
    best = np.sum(sd**2 / mean_rule(sd, 40))
    assert best < np.sum(sd**2 / au.uniform_inclusion(300, 40)), "uniform sampling does better"
    for _ in range(50):
        other = np.sum(sd**2 / au.water_filling(rng.uniform(size=300), 40))
        assert best <= other + 1e-6, "another rule with the same budget does better"


def test_lowers_the_variance_of_the_active_mean(mean_rule):
    rng = np.random.default_rng(2)
    n = 400
    x = rng.uniform(size=n)
    sd = 0.05 + 2 * (x > 0.8)
    rules = {"optimal": mean_rule(sd, 40), "uniform": au.uniform_inclusion(n, 40)}
    spread = {}
    for rule, pi in rules.items():
        estimates = []
        for _ in range(1500):
            y = x + sd * rng.standard_normal(n)
            w = (rng.uniform(size=n) < pi) / pi
            estimates.append(np.mean(x + w * (y - x)))
        spread[rule] = np.var(estimates)
    assert spread["optimal"] < 0.7 * spread["uniform"], spread
