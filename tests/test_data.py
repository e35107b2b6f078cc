"""Tests for the synthetic two-sample generators."""

import numpy as np
import pytest

from icml26.data import KINDS, two_sample

THETA = {"null": 0.0, "scale": 1.5, "corr": 0.4, "location": 2.0, "mixture": 3.0}


@pytest.mark.parametrize("kind", KINDS)
def test_shapes_dtype_and_determinism(kind):
    X, Y = two_sample(kind, 7, 9, 3, THETA[kind], seed=5)
    assert X.shape == (7, 3) and Y.shape == (9, 3)
    assert X.dtype == Y.dtype == np.float64
    X_again, Y_again = two_sample(kind, 7, 9, 3, THETA[kind], seed=5)
    np.testing.assert_array_equal(X, X_again)
    np.testing.assert_array_equal(Y, Y_again)
    X_other, _ = two_sample(kind, 7, 9, 3, THETA[kind], seed=6)
    assert not np.array_equal(X, X_other)


def big_sample(kind, theta, d=4):
    return two_sample(kind, 20_000, 20_000, d, theta, seed=1)


def test_null_has_identical_standard_normal_samples():
    X, Y = big_sample("null", 0.0)
    for sample in (X, Y):
        np.testing.assert_allclose(sample.mean(0), 0, atol=0.03)
        np.testing.assert_allclose(np.cov(sample.T), np.eye(4), atol=0.04)


def test_scale_multiplies_every_standard_deviation():
    _, Y = big_sample("scale", 1.5)
    np.testing.assert_allclose(Y.std(0), 1.5, rtol=0.02)
    np.testing.assert_allclose(Y.mean(0), 0, atol=0.04)


def test_corr_is_equicorrelated_with_unit_variances():
    _, Y = big_sample("corr", 0.4)
    correlation = np.corrcoef(Y.T)
    off_diagonal = correlation[~np.eye(4, dtype=bool)]
    np.testing.assert_allclose(off_diagonal, 0.4, atol=0.03)
    np.testing.assert_allclose(Y.var(0), 1.0, rtol=0.04)  # trace preserved


def test_location_shift_has_requested_norm_spread_evenly():
    _, Y = big_sample("location", 2.0)
    np.testing.assert_allclose(Y.mean(0), 2.0 / np.sqrt(4), atol=0.03)
    np.testing.assert_allclose(Y.std(0), 1.0, rtol=0.02)


def test_mixture_shifts_half_the_points_along_the_diagonal():
    _, Y = big_sample("mixture", 3.0)
    direction = np.full(4, 0.5)
    projection = Y @ direction
    assert projection.mean() == pytest.approx(1.5, abs=0.04)
    # Half the mass at 0 and half at 3: variance 1 + 3^2 / 4 along the shift, 1 across it.
    assert projection.var() == pytest.approx(1 + 9 / 4, rel=0.03)
    across = Y @ np.array([0.5, -0.5, 0.5, -0.5])
    assert across.var() == pytest.approx(1.0, rel=0.03)


@pytest.mark.parametrize(
    "args, error, message",
    [
        (("shift", 5, 5, 2, 0.0), ValueError, "unknown kind"),
        (("null", 1, 5, 2, 0.0), ValueError, "n must be at least 2"),
        (("null", 5, 1, 2, 0.0), ValueError, "m must be at least 2"),
        (("null", 5, 5, 0, 0.0), ValueError, "d must be at least 1"),
        (("null", 5.0, 5, 2, 0.0), TypeError, "n must be an integer"),
        (("null", True, 5, 2, 0.0), TypeError, "n must be an integer"),
        (("scale", 5, 5, 2, 0.0), ValueError, "theta > 0"),
        (("scale", 5, 5, 2, -1.0), ValueError, "theta > 0"),
        (("corr", 5, 5, 2, 1.0), ValueError, "0 <= theta < 1"),
        (("corr", 5, 5, 2, -0.1), ValueError, "0 <= theta < 1"),
        (("location", 5, 5, 2, -1.0), ValueError, "theta >= 0"),
        (("mixture", 5, 5, 2, float("nan")), ValueError, "finite"),
        (("location", 5, 5, 2, "1"), TypeError, "theta must be a real number"),
    ],
)
def test_bad_arguments_raise(args, error, message):
    with pytest.raises(error, match=message):
        two_sample(*args)


def test_negative_seed_raises():
    with pytest.raises(ValueError, match="seed must be at least 0"):
        two_sample("null", 5, 5, 2, seed=-1)
