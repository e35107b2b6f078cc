"""Exercise mod-ex-statistic: the standardised MOD statistic, point by point."""

import torch

from icml26 import mod_two_sample as mt
from icml26.data import two_sample
from icml26.kernels import gaussian_kernel, median_distance, pairwise_distances

OK_FORMAT = False
name = "mod-ex-statistic"
points = 3


def test_matches_the_library_for_unequal_sizes(standardised_mod):
    for seed, (n, m, d) in enumerate([(10, 25, 3), (30, 12, 8), (15, 15, 20)]):
        X, Y = two_sample("location", n, m, d, 1.0, seed=seed)
        Z = torch.cat([torch.from_numpy(X), torch.from_numpy(Y)])
        K = gaussian_kernel(pairwise_distances(Z), median_distance(Z))
        labels = mt.first_n_labels(n, m)
        mine = float(standardised_mod(K, labels))
        reference = mt.mod_statistic(K, labels).item()
        assert abs(mine - reference) <= 1e-10 * reference, f"n={n}, m={m}: {mine} != {reference}"
