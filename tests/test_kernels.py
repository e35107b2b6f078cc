"""Tests for the shared kernel block: validation, distances, bandwidths and kernel banks."""

import numpy as np
import pytest
import torch
from scipy.spatial.distance import cdist, pdist
from sklearn.metrics.pairwise import laplacian_kernel, rbf_kernel

from icml26.kernels import (
    DEFAULT_BANK_SPECS,
    as_samples,
    distance_kernel,
    gaussian_kernel,
    kernel_bank,
    laplace_kernel,
    median_distance,
    pairwise_distances,
)


@pytest.fixture
def points():
    rng = np.random.default_rng(0)
    return rng.standard_normal((15, 4)), rng.standard_normal((11, 4)) * 1.5


def test_as_samples_returns_float64_tensors_from_numpy_and_torch(points):
    X, Y = points
    from_numpy = as_samples(X, Y.astype(np.float32))
    from_torch = as_samples(torch.from_numpy(X), torch.from_numpy(Y))
    assert all(t.dtype == torch.float64 for t in (*from_numpy, *from_torch))
    torch.testing.assert_close(from_numpy[0], from_torch[0], rtol=0, atol=0)
    assert as_samples(np.arange(3.0), np.arange(4.0))[0].shape == (3, 1)


@pytest.mark.parametrize("p, metric", [(1, "cityblock"), (2, "euclidean")])
def test_pairwise_distances_match_scipy(points, p, metric):
    X, Y = points
    np.testing.assert_allclose(pairwise_distances(X, Y, p=p).numpy(), cdist(X, Y, metric))
    within = pairwise_distances(X, p=p)
    assert torch.all(within.diagonal() == 0)
    torch.testing.assert_close(within, within.T, rtol=0, atol=0)


@pytest.mark.parametrize("p, metric", [(1, "cityblock"), (2, "euclidean")])
def test_median_distance_is_median_over_distinct_pairs(points, p, metric):
    Z = np.vstack(points)
    assert median_distance(Z, p=p) == pytest.approx(np.median(pdist(Z, metric)), rel=1e-14)
    odd_count = Z[:6]  # 15 pairs: the median is one pair's distance
    assert median_distance(odd_count, p=p) == pytest.approx(np.median(pdist(odd_count, metric)))


def test_kernels_match_sklearn(points):
    Z = np.vstack(points)
    h = 1.7
    gauss = gaussian_kernel(pairwise_distances(Z), h).numpy()
    laplace = laplace_kernel(pairwise_distances(Z, p=1), h).numpy()
    np.testing.assert_allclose(gauss, rbf_kernel(Z, gamma=1 / (2 * h**2)), rtol=1e-12)
    np.testing.assert_allclose(laplace, laplacian_kernel(Z, gamma=1 / h), rtol=1e-12)
    np.testing.assert_allclose(distance_kernel(pairwise_distances(Z)).numpy(), -cdist(Z, Z))


def test_default_bank_has_ten_named_kernels_scaled_from_pooled_medians(points):
    Z = np.vstack(points)
    bank = kernel_bank(Z)
    assert bank.matrices.shape == (10, 26, 26)
    assert bank.matrices.dtype == torch.float64
    assert bank.names[:3] == ("gauss x0.25", "gauss x0.5", "gauss x1")
    assert bank.names[-1] == "laplace x4"
    median_l2, median_l1 = median_distance(Z), median_distance(Z, p=1)
    for (family, scale), h in zip(DEFAULT_BANK_SPECS, bank.bandwidths, strict=True):
        expected = scale * (median_l2 if family == "gauss" else median_l1)
        assert h == pytest.approx(expected, rel=1e-14)
    gauss_x1 = gaussian_kernel(pairwise_distances(Z), median_l2)
    torch.testing.assert_close(bank.matrices[bank.index("gauss x1")], gauss_x1)


def test_energy_kernel_in_bank(points):
    Z = np.vstack(points)
    bank = kernel_bank(Z, [("energy", 1.0), ("gauss", 2)])
    assert bank.names == ("energy", "gauss x2")
    assert np.isnan(bank.bandwidths[0])
    torch.testing.assert_close(bank.matrices[0], -pairwise_distances(Z))


def test_bank_is_equivariant_to_permuting_the_pooled_sample(points):
    Z = np.vstack(points)
    order = np.random.default_rng(1).permutation(len(Z))
    bank, shuffled = kernel_bank(Z), kernel_bank(Z[order])
    assert shuffled.bandwidths == pytest.approx(bank.bandwidths, rel=1e-14)
    torch.testing.assert_close(shuffled.matrices, bank.matrices[:, order][:, :, order])


@pytest.mark.parametrize(
    "X, Y, error, message",
    [
        (np.zeros((5, 3)), np.zeros((5, 2)), ValueError, "same number of features"),
        (np.zeros((1, 3)), np.zeros((5, 3)), ValueError, "at least two points"),
        (np.zeros((5, 3)), np.zeros((1, 3)), ValueError, "at least two points"),
        (np.array([[0.0, np.nan], [1, 1]]), np.zeros((3, 2)), ValueError, "NaN or infinite"),
        (np.zeros((3, 2)), np.array([[0.0, np.inf], [1, 1]]), ValueError, "NaN or infinite"),
        (np.zeros((3, 2, 2)), np.zeros((3, 2, 2)), ValueError, "1-D or 2-D"),
        ([[0.0, 1.0], [1.0, 2.0]], np.zeros((3, 2)), TypeError, "numpy array or torch tensor"),
        (np.array([["a"], ["b"]]), np.zeros((3, 1)), TypeError, "real numbers"),
        (np.zeros((3, 1), dtype=complex), np.zeros((3, 1)), TypeError, "real"),
        (torch.zeros(3, 1, dtype=torch.bool), np.zeros((3, 1)), TypeError, "real numbers"),
    ],
)
def test_as_samples_rejects_bad_input(X, Y, error, message):
    with pytest.raises(error, match=message):
        as_samples(X, Y)


@pytest.mark.parametrize("bandwidth", [0.0, -1.0, float("nan"), float("inf")])
def test_kernels_reject_non_positive_or_non_finite_bandwidth(bandwidth):
    distances = pairwise_distances(np.eye(3))
    with pytest.raises(ValueError, match="bandwidth must be finite and positive"):
        gaussian_kernel(distances, bandwidth)
    with pytest.raises(ValueError, match="bandwidth must be finite and positive"):
        laplace_kernel(distances, bandwidth)


def test_kernels_reject_non_numeric_bandwidth():
    with pytest.raises(TypeError, match="bandwidth must be a real number"):
        gaussian_kernel(pairwise_distances(np.eye(3)), "1")


@pytest.mark.parametrize(
    "specs, error, message",
    [
        ([("gauss", 0.0)], ValueError, "finite and positive"),
        ([("gauss", -2.0)], ValueError, "finite and positive"),
        ([("cauchy", 1.0)], ValueError, "unknown kernel family"),
        ([("gauss", 1.0), ("gauss", 1)], ValueError, "repeat a kernel"),
        ([], TypeError, "non-empty sequence"),
        ("gauss", TypeError, "non-empty sequence"),
        (["gauss"], TypeError, r"\(family, scale\) pair"),
    ],
)
def test_kernel_bank_rejects_bad_specs(specs, error, message):
    with pytest.raises(error, match=message):
        kernel_bank(np.eye(4), specs)


def test_median_distance_rejects_repeated_points_and_bad_p():
    with pytest.raises(ValueError, match="median inter-point distance is 0"):
        median_distance(np.vstack([np.zeros((5, 2)), np.ones((1, 2))]))
    with pytest.raises(ValueError, match="p must be 1"):
        pairwise_distances(np.eye(3), p=3)


def test_bank_index_rejects_unknown_name(points):
    bank = kernel_bank(np.vstack(points), [("gauss", 1.0)])
    with pytest.raises(KeyError, match="not in the bank"):
        bank.index("gauss x3")
