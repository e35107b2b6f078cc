"""Exercise ccq-ex-additivity: additivity of quadratic loss increases."""

import numpy as np

OK_FORMAT = False
name = "ccq-ex-additivity"
points = 2


def test_cross_term(additivity_ratio_quadratic, rng):
    M = rng.standard_normal((5, 5))
    A = M @ M.T + np.eye(5)
    e1, e2 = rng.standard_normal(5), rng.standard_normal(5)
    q = lambda e: 0.5 * e @ A @ e  # noqa: E731
    expected = q(e1 + e2) / (q(e1) + q(e2))
    assert abs(additivity_ratio_quadratic(A, e1, e2) - expected) < 1e-10
    assert abs(additivity_ratio_quadratic(A, e1, e1) - 2) < 1e-10
    assert abs(additivity_ratio_quadratic(A, e1, -e1)) < 1e-10
