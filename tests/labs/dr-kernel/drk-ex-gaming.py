"""Exercise drk-ex-gaming: a lazy strategy with inflated coverage defeats PR + PRS."""

OK_FORMAT = False
name = "drk-ex-gaming"
points = 3


def test_gamed_environment_raises_lazy_coverage(gamed_outcomes):
    import numpy as np

    out = gamed_outcomes(np.zeros(500, dtype=int), np.random.default_rng(0))
    assert np.all(out.coverage >= 0.8) and np.all(out.coverage <= 0.95)
    assert np.all(out.true_speedup < 1.2)


def test_lazy_wins_again(final_policy, gamed_outcomes):
    policy = final_policy(gamed_outcomes, 3, 150)
    assert policy[0] > policy[1]
