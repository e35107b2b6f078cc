"""Exercise dst-ex-mirror: the reverse-KL projection onto a dual probe level is tilting."""

import numpy as np
import pytest

from icml26 import dual_steering as ds

OK_FORMAT = False
name = "dst-ex-mirror"
points = 3


def test_solution_is_on_the_primal_line_and_feasible(mirror_projection, rng):
    G = rng.standard_normal((20, 3))
    lam0, v = rng.standard_normal(3), rng.standard_normal(3)
    level = float(v @ ds.mean_parameter(G, lam0) - 0.4)
    lam = np.asarray(mirror_projection(G, lam0, v, level), dtype=float)
    assert abs(v @ ds.mean_parameter(G, lam) - level) < 1e-8
    moved = lam - lam0
    assert np.allclose(moved - (moved @ v) / (v @ v) * v, 0, atol=1e-9)


def test_no_feasible_point_has_smaller_reverse_kl(mirror_projection):
    rng = np.random.default_rng(6)
    G = rng.standard_normal((20, 3))
    lam0, v = rng.standard_normal(3), rng.standard_normal(3)
    level = float(v @ ds.mean_parameter(G, lam0) + 0.3)
    best = np.asarray(mirror_projection(G, lam0, v, level), dtype=float)
    p0 = ds.probabilities(G, lam0)
    value = ds.kl_divergence(ds.probabilities(G, best), p0)
    mu_best = ds.mean_parameter(G, best)
    for _ in range(10):
        u = rng.standard_normal(3)
        u -= (u @ v) / (v @ v) * v
        mu = mu_best + 0.05 * u
        if ds.hull_margin(G, mu) > 1e-9:
            other = ds.dual_to_primal(G, mu)
            assert ds.kl_divergence(ds.probabilities(G, other), p0) >= value - 1e-10


def test_rejects_unattainable_levels(mirror_projection):
    rng = np.random.default_rng(8)
    G = rng.standard_normal((20, 3))
    lam0, v = rng.standard_normal(3), rng.standard_normal(3)
    with pytest.raises(ValueError):
        mirror_projection(G, lam0, v, float((G @ v).max() + 0.1))
    with pytest.raises(ValueError):
        mirror_projection(G, lam0, v, float((G @ v).min() - 0.1))
