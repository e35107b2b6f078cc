"""Exercise sfp-ex-tau: the temperature that minimises the sFP regret bound."""

import numpy as np

import icml26.fictitious_play as fp
from icml26.fictitious_play import regret_bound

OK_FORMAT = False
name = "sfp-ex-tau"
points = 2


def test_best_tau_minimises_the_bound(best_tau):
    for K, n, r in ((100, 3, 2.0), (1000, 3, 2.0), (5000, 5, 1.0)):
        tau = best_tau(K, n, r)
        grid = np.exp(np.linspace(np.log(tau) - 1, np.log(tau) + 1, 201))
        best_on_grid = min(regret_bound(t, n, K, r) for t in grid)
        assert regret_bound(tau, n, K, r) <= best_on_grid + 1e-12, (K, n, r, tau)


def test_best_tau_regret_holds_against_the_adversary(best_tau):
    A, _ = fp.rock_paper_scissors()
    tau = best_tau(600, 3, 2.0)
    run = fp.against_adversary(A, 600, tau=tau, rng=np.random.default_rng(5))
    assert run.average_regret(0)[-1] <= fp.regret_bound(tau, 3, 600, 2.0)
    assert best_tau(10_000, 3, 2.0) < best_tau(100, 3, 2.0), "longer horizons want lower tau"
