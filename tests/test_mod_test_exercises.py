"""The mod-test chapter's exercise solutions, checked as an instructor would."""

import numpy as np
import pytest
import torch

from icml26 import mod_test as mt
from icml26.data import two_sample
from icml26.kernels import gaussian_kernel, median_distance, pairwise_distances

from .exercise_tools import solution_namespace


@pytest.fixture(scope="module")
def cancellation():
    return solution_namespace("mod-test", "mod-ex-cancellation")["population_terms"]


def test_cancellation_terms_have_opposite_signs_and_mmd_vanishes_faster(cancellation):
    h, d = np.sqrt(200.0), 100
    ratios = []
    for s in (1.2, 1.1, 1.05, 1.01, 0.99, 0.95):
        d_x, d_y, mmd2 = cancellation(s, h, d)
        assert d_x * d_y < 0 and mmd2 > 0
        assert mmd2 == pytest.approx(d_x + d_y)
        ratios.append(mmd2 / abs(d_x))
    assert ratios[0] > ratios[1] > ratios[2] > ratios[3]


def test_cancellation_terms_match_sample_averages(cancellation):
    n, d, s = 400, 50, 1.1
    X, Y = two_sample("scale", n, n, d, s, seed=3)
    Z = torch.cat([torch.from_numpy(X), torch.from_numpy(Y)])
    h = median_distance(Z)
    K = gaussian_kernel(pairwise_distances(Z), h)
    d_x, d_y = mt.mmd_differences(K, mt.first_n_labels(n, n))
    exact_x, exact_y, _ = cancellation(s, h, d)
    assert d_x.item() == pytest.approx(exact_x, rel=0.15)
    assert d_y.item() == pytest.approx(exact_y, rel=0.15)


def test_standardised_mod_solution_matches_the_library():
    standardised_mod = solution_namespace("mod-test", "mod-ex-statistic")["standardised_mod"]
    for seed, (n, m, d) in enumerate([(10, 25, 3), (30, 12, 8), (15, 15, 20)]):
        X, Y = two_sample("location", n, m, d, 1.0, seed=seed)
        Z = torch.cat([torch.from_numpy(X), torch.from_numpy(Y)])
        K = gaussian_kernel(pairwise_distances(Z), median_distance(Z))
        labels = mt.first_n_labels(n, m)
        assert standardised_mod(K, labels).item() == pytest.approx(
            mt.mod_statistic(K, labels).item(), rel=1e-10)


def test_power_by_dimension_solution_shows_the_trend():
    power_by_dimension = solution_namespace("mod-test", "mod-ex-dimension")["power_by_dimension"]
    rates = power_by_dimension((2, 200), 1.1, trials=30, seed=1)
    assert rates[200]["mod"] > rates[2]["mod"] + 0.3
    assert rates[200]["mod"] > rates[200]["mmd"]
