"""Exercise drk-ex-gaming: a lazy strategy with inflated coverage defeats PR + PRS."""

import numpy as np

OK_FORMAT = False
name = "drk-ex-gaming"
points = 3


def test_gamed_environment_raises_lazy_coverage(gamed_outcomes, submission):
    coverage, true_speedup = submission.evaluate(
        "out = gamed_outcomes(choice, rng)\nout.coverage, out.true_speedup",
        choice=np.zeros(500, dtype=int), rng=np.random.default_rng(0))
    assert np.all(coverage >= 0.8) and np.all(coverage <= 0.95)
    assert np.all(true_speedup < 1.2)


def test_lazy_wins_again(final_policy, gamed_outcomes):
    policy = final_policy(gamed_outcomes, 3, 150)
    assert policy[0] > policy[1]
