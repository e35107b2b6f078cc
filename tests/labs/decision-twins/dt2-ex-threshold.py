"""Exercise dt2-ex-threshold: where the counterexample's ranking flips, and its price."""

import numpy as np

from icml26 import decision_twins as dt

OK_FORMAT = False
name = "dt2-ex-threshold"
points = 2


def test_boundary_and_price(ranking_boundary, price):
    for target, b in [(0.6, 0.8), (0.6, 0.9), (0.5, 0.85)]:
        example = dt.Counterexample(target, 1.0, b)
        fine = np.linspace(0.01, 1.5, 150_001)
        first = fine[np.argmax(example.ranks_correctly(fine))]
        assert abs(float(ranking_boundary(target, b)) - first) < 1e-4
    for b in (0.8, 0.9):
        example = dt.Counterexample(0.6, 1.0, b)
        theta = 2 * 0.6 / (1 + b)
        expected = example.one_step_mse(theta) - example.one_step_mse(0.6)
        assert abs(float(price(0.6, b)) - expected) < 1e-6
