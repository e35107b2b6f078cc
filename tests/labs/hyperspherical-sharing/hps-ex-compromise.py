"""Exercise hps-ex-compromise: the curvature-weighted compromise of one shared scale."""

import numpy as np

OK_FORMAT = False
name = "hps-ex-compromise"
points = 1


def test_compromise_matches_gradient_descent(compromise, rng):
    for _ in range(5):
        targets, curvatures = rng.normal(size=4), rng.uniform(0.2, 3.0, size=4)
        rho, left = compromise(targets, curvatures)
        grid = np.linspace(-4, 4, 400_001)
        losses = (curvatures[:, None] / 2 * (grid[None] - targets[:, None]) ** 2).sum(0)
        assert abs(float(rho) - grid[losses.argmin()]) < 1e-4
        assert abs(float(left) - losses.min()) < 1e-6
    rho, left = compromise([2.0, 2.0], [1.0, 5.0])
    assert abs(float(rho) - 2.0) < 1e-12 and abs(float(left)) < 1e-12
