"""Exercise mod-ex-cancellation: exact population differences under a scale shift."""

import numpy as np
import torch

from icml26 import mod_two_sample as mt
from icml26.data import two_sample
from icml26.kernels import gaussian_kernel, median_distance, pairwise_distances

OK_FORMAT = False
name = "mod-ex-cancellation"
points = 2


def test_opposite_signs_and_vanishing_ratio(population_terms):
    h, d = np.sqrt(200.0), 100
    ratios = []
    for s in (1.2, 1.1, 1.05, 1.01, 0.99, 0.95):
        d_x, d_y, mmd2 = population_terms(s, h, d)
        assert d_x * d_y < 0, f"D_X and D_Y should have opposite signs at s = {s}"
        assert mmd2 > 0, f"MMD^2 must be positive at s = {s}, got {mmd2}"
        assert abs(mmd2 - (d_x + d_y)) < 1e-12, "MMD^2 should equal D_X + D_Y"
        ratios.append(mmd2 / abs(d_x))
    assert ratios[0] > ratios[1] > ratios[2] > ratios[3], "MMD^2/|D_X| should shrink as s -> 1"


def test_matches_sample_averages(population_terms):
    n, d, s = 400, 50, 1.1
    X, Y = two_sample("scale", n, n, d, s, seed=3)
    Z = torch.cat([torch.from_numpy(X), torch.from_numpy(Y)])
    h = median_distance(Z)
    K = gaussian_kernel(pairwise_distances(Z), h)
    d_x, d_y = mt.mmd_differences(K, mt.first_n_labels(n, n))
    exact_x, exact_y, _ = population_terms(s, h, d)
    assert abs(d_x.item() - exact_x) < 0.15 * abs(exact_x), (d_x.item(), exact_x)
    assert abs(d_y.item() - exact_y) < 0.15 * abs(exact_y), (d_y.item(), exact_y)
