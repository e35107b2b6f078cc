"""Exercise rita-ex-bures: the squared Bures distance between covariances."""

import numpy as np
import ot

OK_FORMAT = False
name = "rita-ex-bures"
points = 2


def test_bures_against_pot_and_diagonal(bures_squared):
    g = np.random.default_rng(7)
    u, v = g.normal(size=(3, 3)), g.normal(size=(3, 3))
    A, B = u @ u.T + 0.2 * np.eye(3), v @ v.T + 0.2 * np.eye(3)
    mu = np.zeros(3)
    w2 = float(ot.gaussian.bures_wasserstein_distance(mu, mu, A, B))
    assert abs(bures_squared(A, B) - w2 ** 2) < 1e-6
    assert abs(bures_squared(A, A)) < 1e-6
    a, b = np.array([2.0, 0.5]), np.array([0.5, 3.0])
    assert abs(bures_squared(np.diag(a), np.diag(b)) - np.sum((np.sqrt(a) - np.sqrt(b)) ** 2)) \
        < 1e-9
