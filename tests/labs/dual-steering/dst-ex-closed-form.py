"""Exercise dst-ex-closed-form: the map back of the multinomial logit head in closed form."""

import numpy as np
import pytest

from icml26 import dual_steering as ds

OK_FORMAT = False
name = "dst-ex-closed-form"
points = 2


def test_matches_the_convex_solver(closed_form_map_back, rng):
    G = np.vstack([np.zeros(4), np.eye(4)])
    for _ in range(4):
        mu = rng.dirichlet(np.ones(5))[1:]
        lam = np.asarray(closed_form_map_back(mu), dtype=float)
        assert np.allclose(ds.mean_parameter(G, lam), mu, atol=1e-10)
        assert np.allclose(lam, ds.dual_to_primal(G, mu), atol=1e-5)


def test_rejects_unattainable_means(closed_form_map_back):
    with pytest.raises(ValueError):
        closed_form_map_back(np.array([0.5, 0.6, 0.1]))
    with pytest.raises(ValueError):
        closed_form_map_back(np.array([0.0, 0.3]))
