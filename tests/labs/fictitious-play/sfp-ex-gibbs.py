"""Exercise sfp-ex-gibbs: the logit response maximises payoff plus entropy."""

import numpy as np

from icml26.fictitious_play import smooth_best_response

OK_FORMAT = False
name = "sfp-ex-gibbs"
points = 2


def test_logit_response_matches_the_library(logit_response, rng):
    for _ in range(10):
        u, tau = rng.normal(size=5) * 3, rng.uniform(0.01, 3)
        p = np.asarray(logit_response(u, tau), dtype=float)
        assert p.shape == (5,) and abs(p.sum() - 1) < 1e-12, "return a probability vector"
        assert np.allclose(p, smooth_best_response(u, tau), atol=1e-12), (u, tau)
    big = np.array([800.0, 0.0, -800.0])
    assert np.all(np.isfinite(logit_response(big, 0.5))), "compute the softmax stably"


def test_gibbs_value_is_the_maximum(gibbs_value, logit_response):
    rng = np.random.default_rng(12)
    u, tau = rng.normal(size=4), 0.4
    p = np.asarray(logit_response(u, tau))
    entropy = -np.sum(p * np.log(p))
    assert abs(gibbs_value(u, tau) - (p @ u + tau * entropy)) < 1e-10
    mixtures = rng.dirichlet(np.ones(4), size=4000)
    values = mixtures @ u - tau * np.sum(mixtures * np.log(mixtures), axis=1)
    assert values.max() <= gibbs_value(u, tau) + 1e-12
    assert abs(gibbs_value(u, 1e-3) - u.max()) < 1e-2, "tau -> 0 gives the best payoff"
