"""Tests for the MOD chapter's statistics, exact permutation moments and permutation engine."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import energy_distance

import icml26.mod_two_sample as mt
from icml26.data import two_sample
from icml26.kernels import DEFAULT_BANK_SPECS, kernel_bank


def gaussian_gram(Z, bandwidth=1.5):
    squared = ((Z[:, None, :] - Z[None, :, :]) ** 2).sum(-1)
    return np.exp(-squared / (2 * bandwidth**2))


@pytest.fixture
def unequal():
    """n = 9, m = 13 points with a scale difference, pooled as Z = (X, Y)."""
    X, Y = two_sample("scale", 9, 13, 3, 1.4, seed=2)
    return X, Y, np.vstack([X, Y]), mt.first_n_labels(9, 13).numpy()


def averages_by_loops(K, labels):
    """Eq. (1) written as plain double loops."""
    N = len(K)
    sums = {"xx": 0.0, "yy": 0.0, "xy": 0.0}
    for i in range(N):
        for j in range(N):
            if i == j:
                continue
            if labels[i] and labels[j]:
                sums["xx"] += K[i, j]
            elif not labels[i] and not labels[j]:
                sums["yy"] += K[i, j]
            elif labels[i]:
                sums["xy"] += K[i, j]
    n, m = labels.sum(), (~labels).sum()
    return sums["xx"] / (n * (n - 1)), sums["yy"] / (m * (m - 1)), sums["xy"] / (n * m)


def mod_by_loops(K, labels):
    """The paper's MOD (Eqs. 10, 11) as a direct O(N^2) loop over points."""
    A = K.copy()
    np.fill_diagonal(A, 0)
    N = len(A)
    best = 0.0
    for i in range(N):
        own = [j for j in range(N) if j != i and labels[j] == labels[i]]
        other = [j for j in range(N) if labels[j] != labels[i]]
        n_g = len(own) + 1
        p_in = sum(A[i, j] for j in own) / (n_g - 1)
        p_out = sum(A[i, j] for j in other) / (N - n_g)
        mu = A[i].sum() / (N - 1)
        delta1 = (A[i] ** 2).sum() / (N - 1) - mu**2
        v = delta1 * (N - 1) / (N - 2)
        term = 0.0 if v == 0 else (p_in - p_out) ** 2 / ((1 / (n_g - 1) + 1 / (N - n_g)) * v)
        best = max(best, term)
    return best


# ------------------------------------------------------------------ Eqs. (1)-(3), (6), (7), (15)


def test_unbiased_mmd_matches_double_loop(unequal):
    _, _, Z, labels = unequal
    K = gaussian_gram(Z)
    k_xx, k_yy, k_xy = averages_by_loops(K, labels)
    averages = mt.kernel_averages(K, labels)
    np.testing.assert_allclose([a.item() for a in averages], [k_xx, k_yy, k_xy], rtol=1e-12)
    assert mt.mmd2_unbiased(K, labels).item() == pytest.approx(k_xx + k_yy - 2 * k_xy, rel=1e-12)


def test_mmd_is_sum_of_the_two_differences(unequal):
    _, _, Z, labels = unequal
    K = gaussian_gram(Z)
    d_x, d_y = mt.mmd_differences(K, labels)
    assert (d_x + d_y).item() == pytest.approx(mt.mmd2_unbiased(K, labels).item(), abs=1e-15)
    assert d_x.item() * d_y.item() < 0  # scale shift: the two differences disagree in sign


def test_cross_average_identity_is_exact(unequal):
    _, _, Z, labels = unequal
    K = gaussian_gram(Z)
    k_xx, k_yy, k_xy = mt.kernel_averages(K, labels)
    total = K.sum() - np.trace(K)
    rebuilt = mt.cross_average_from_within(total, k_xx, k_yy, 9, 13)
    assert rebuilt.item() == pytest.approx(k_xy.item(), rel=1e-13)


def test_group_mod_equals_half_sum_identity(unequal):
    _, _, Z, labels = unequal
    K = gaussian_gram(Z)
    k_xx, k_yy, _ = mt.kernel_averages(K, labels)
    half_sum = 0.5 * (abs(mt.mmd2_unbiased(K, labels)) + abs(k_xx - k_yy))
    assert math.sqrt(mt.group_mod(K, labels).item()) == pytest.approx(half_sum.item(), rel=1e-12)


def test_energy_statistic_matches_brute_force_and_scipy():
    rng = np.random.default_rng(3)
    X, Y = rng.standard_normal((8, 3)), rng.standard_normal((6, 3)) + 0.5

    def mean_distance(A, B, skip_diagonal):
        pairs = [
            np.linalg.norm(a - b)
            for i, a in enumerate(A)
            for j, b in enumerate(B)
            if not (skip_diagonal and i == j)
        ]
        return np.mean(pairs)

    expected = (
        2 * mean_distance(X, Y, False) - mean_distance(X, X, True) - mean_distance(Y, Y, True)
    )
    assert mt.energy_statistic(X, Y).item() == pytest.approx(expected, rel=1e-12)

    # In 1-D scipy gives sqrt(2 E|X-Y| - E|X-X'| - E|Y-Y'|) with V-statistics (i = j included),
    # which is our U-statistic plus the within means divided by n and m.
    u, v = X[:, 0], Y[:, 0]
    within_u = np.abs(u[:, None] - u[None, :]).sum() / (8 * 7)
    within_v = np.abs(v[:, None] - v[None, :]).sum() / (6 * 5)
    v_statistic = mt.energy_statistic(u, v).item() + within_u / 8 + within_v / 6
    assert v_statistic == pytest.approx(energy_distance(u, v) ** 2, rel=1e-12)


# ------------------------------------------------------------------------- Eqs. (10), (11)


def test_within_between_means_match_definition(unequal):
    _, _, Z, labels = unequal
    K = gaussian_gram(Z)
    p_in, p_out = mt.within_between_means(K, labels)
    A = K - np.diag(np.diag(K))
    i_x, i_y = 2, 15  # one point of each group
    assert p_in[i_x].item() == pytest.approx(A[i_x, :9].sum() / 8, rel=1e-13)
    assert p_out[i_x].item() == pytest.approx(A[i_x, 9:].sum() / 13, rel=1e-13)
    assert p_in[i_y].item() == pytest.approx(A[i_y, 9:].sum() / 12, rel=1e-13)
    assert p_out[i_y].item() == pytest.approx(A[i_y, :9].sum() / 9, rel=1e-13)


@pytest.mark.parametrize("sizes", [(9, 13), (11, 11)])
def test_engine_mod_matches_direct_loop_for_every_labelling(sizes):
    n, m = sizes
    X, Y = two_sample("scale", n, m, 4, 1.3, seed=n)
    bank = kernel_bank(np.vstack([X, Y]), [("gauss", 1.0), ("laplace", 0.5), ("energy", 1.0)])
    stats = mt.permutation_statistics(bank.matrices, n, m, 12, torch.Generator().manual_seed(4))
    indicators = mt.permutation_indicators(n, m, 12, torch.Generator().manual_seed(4))
    for kernel, K in enumerate(bank.matrices.numpy()):
        for b in (0, 1, 7, 12):
            labels = indicators[:, b].numpy().astype(bool)
            expected = mod_by_loops(K, labels)
            assert stats.mod[kernel, b].item() == pytest.approx(expected, rel=1e-10, abs=1e-12)
            assert mt.mod_statistic(K, labels).item() == pytest.approx(expected, rel=1e-10)


def test_engine_column_zero_equals_direct_statistics(unequal):
    X, Y, Z, labels = unequal
    bank = kernel_bank(Z, [*DEFAULT_BANK_SPECS, ("energy", 1.0)])
    stats = mt.permutation_statistics(bank.matrices, 9, 13, 30)
    assert all(s.dtype == torch.float64 for s in (stats.k_xx, stats.k_yy, stats.k_xy, stats.mod))
    for kernel, K in enumerate(bank.matrices):
        d_x, d_y = mt.mmd_differences(K, labels)
        np.testing.assert_allclose(stats.mmd2[kernel, 0], mt.mmd2_unbiased(K, labels), rtol=1e-10)
        np.testing.assert_allclose(stats.d_x[kernel, 0], d_x, rtol=1e-10)
        np.testing.assert_allclose(stats.d_y[kernel, 0], d_y, rtol=1e-10)
        np.testing.assert_allclose(stats.mod[kernel, 0], mt.mod_statistic(K, labels), rtol=1e-10)
    energy = stats.mmd2[bank.index("energy"), 0]
    assert energy.item() == pytest.approx(mt.energy_statistic(X, Y).item(), rel=1e-10)


def test_chunking_does_not_change_the_engine(unequal, monkeypatch):
    _, _, Z, _ = unequal
    bank = kernel_bank(Z)
    whole = mt.permutation_statistics(bank.matrices, 9, 13, 40)
    monkeypatch.setattr(mt, "CHUNK_ELEMENTS", 3 * 10 * 22)  # chunks of 3 labellings
    chunked = mt.permutation_statistics(bank.matrices, 9, 13, 40)
    for name in ("k_xx", "k_yy", "k_xy", "mod"):
        torch.testing.assert_close(getattr(chunked, name), getattr(whole, name))


def test_indicators_are_valid_labellings():
    indicators = mt.permutation_indicators(4, 6, 50, torch.Generator().manual_seed(0))
    assert indicators.shape == (10, 51)
    assert torch.equal(indicators[:, 0], mt.first_n_labels(4, 6).double())
    assert torch.all(indicators.sum(0) == 4)
    assert torch.all((indicators == 0) | (indicators == 1))


# ---------------------------------------------------------------------------- Eqs. (8), (9)


def test_exact_permutation_moments_match_monte_carlo():
    n, m, draws = 8, 12, 20_000
    X, Y = two_sample("location", n, m, 2, 1.0, seed=7)
    K = gaussian_gram(np.vstack([X, Y]), bandwidth=1.0)
    A = K - np.diag(np.diag(K))
    rng = np.random.default_rng(11)
    in_x = rng.random((draws, n + m)).argsort(axis=1) < n
    in_y = ~in_x
    k_xx = np.einsum("ri,ij,rj->r", in_x, A, in_x) / (n * (n - 1))
    k_yy = np.einsum("ri,ij,rj->r", in_y, A, in_y) / (m * (m - 1))
    mean, cov = mt.permutation_moments(K, n, m)

    def within_standard_errors(samples, exact):
        error = samples.std() / math.sqrt(draws)
        assert abs(samples.mean() - exact) <= 4 * error

    within_standard_errors(k_xx, mean[0].item())
    within_standard_errors(k_yy, mean[1].item())
    centred = np.stack([k_xx - mean[0].item(), k_yy - mean[1].item()])
    for a in range(2):
        for b in range(2):
            within_standard_errors(centred[a] * centred[b], cov[a, b].item())

    # Eq. (9) uses the moments of D_X, D_Y derived from these.
    k_xy = np.einsum("ri,ij,rj->r", in_x, A, in_y) / (n * m)
    diff_mean, diff_sd = mt.difference_moments(K, n, m)
    for diff, exact_mean, exact_sd in zip(
        (k_xx - k_xy, k_yy - k_xy), diff_mean, diff_sd, strict=True
    ):
        within_standard_errors(diff, exact_mean.item())
        within_standard_errors((diff - exact_mean.item()) ** 2, exact_sd.item() ** 2)


def test_standardised_group_mod_uses_exact_moments(unequal):
    X, Y, Z, labels = unequal
    K = gaussian_gram(Z)
    d_x, d_y = mt.mmd_differences(K, labels)
    diff_mean, diff_sd = mt.difference_moments(K, 9, 13)
    standardised = [(d - mu) / sd for d, mu, sd in zip((d_x, d_y), diff_mean, diff_sd, strict=True)]
    expected = max(z.item() ** 2 for z in standardised)
    assert mt.standardised_group_mod(K, labels).item() == pytest.approx(expected, rel=1e-12)
    result = mt.two_sample_test(X, Y, tests=("smod_group", "mod_group"), n_permutations=20)
    bank = kernel_bank(Z, [("gauss", 1.0)])
    sm = mt.standardised_group_mod(bank.matrices[0], labels).item()
    assert result.statistics["smod_group"][0].item() == pytest.approx(sm, rel=1e-10)
    gm = mt.group_mod(bank.matrices[0], labels).item()
    assert result.statistics["mod_group"][0].item() == pytest.approx(gm, rel=1e-10)


# ------------------------------------------------------------------------- Eqs. (12)-(14)


def test_p_value_formula():
    statistics = torch.tensor([[2.0, 1.0, 3.0, 2.0, 0.5], [9.0, 1.0, 2.0, 3.0, 4.0]])
    torch.testing.assert_close(mt.permutation_p_value(statistics), torch.tensor([0.6, 0.2]))


def test_fused_statistics_follow_their_formulas(unequal):
    _, _, Z, labels = unequal
    bank = kernel_bank(Z)
    mods = torch.stack([mt.mod_statistic(K, labels) for K in bank.matrices]).numpy()
    expected_mod = np.log(np.mean(np.exp(mods)))
    assert mt.fused_mod(torch.from_numpy(mods)).item() == pytest.approx(expected_mod, rel=1e-12)

    mmds = np.array([mt.mmd2_unbiased(K, labels).item() for K in bank.matrices])
    off = bank.matrices.numpy() * (1 - np.eye(22))
    normalisers = np.sqrt((off**2).sum(axis=(1, 2)) / (22 * 21))
    lam = 9 * 8 * math.sqrt(9 * 8 / (22 * 21))
    expected_fuse = np.log(np.mean(np.exp(lam * mmds / normalisers)))
    fuse = mt.mmd_fuse(torch.from_numpy(mmds), mt.fuse_normalisers(bank.matrices), 9, 13)
    assert fuse.item() == pytest.approx(expected_fuse, rel=1e-12)


def test_fused_tests_share_permutations_and_have_valid_p_values(unequal):
    X, Y, Z, _ = unequal
    B = 60
    result = mt.two_sample_test(X, Y, n_permutations=B, seed=3)
    bank = kernel_bank(Z, [*DEFAULT_BANK_SPECS, ("energy", 1.0)])
    stats = mt.permutation_statistics(bank.matrices, 9, 13, B, torch.Generator().manual_seed(3))
    torch.testing.assert_close(result.statistics["mod_fused"], mt.fused_mod(stats.mod[:10]))
    torch.testing.assert_close(result.statistics["mod"], stats.mod[bank.index("gauss x1")])
    torch.testing.assert_close(result.statistics["energy"], stats.mmd2[bank.index("energy")])
    for p in result.p_values.values():
        assert 1 / (B + 1) <= p <= 1
    assert set(result.reject) == {"mmd", "mod", "mod_fused", "mmd_fuse", "energy"}


def test_same_seed_same_result_and_other_seed_other_permutations(unequal):
    X, Y, _, _ = unequal
    first = mt.two_sample_test(X, Y, n_permutations=40, seed=8)
    again = mt.two_sample_test(torch.from_numpy(X), torch.from_numpy(Y), n_permutations=40, seed=8)
    other = mt.two_sample_test(X, Y, n_permutations=40, seed=9)
    for name in first.statistics:
        assert torch.equal(first.statistics[name], again.statistics[name])
        assert first.statistics[name][0] == other.statistics[name][0]
        assert not torch.equal(first.statistics[name][1:], other.statistics[name][1:])
    assert first.p_values == again.p_values


def test_size_under_the_null_is_controlled():
    trials, alpha = 100, 0.05
    study = mt.power_study(
        "null", 5, 0.0, n=20, m=25, trials=trials, n_permutations=100, seed=4, tests=mt.ALL_TESTS
    )
    limit = alpha + 3 * math.sqrt(alpha * (1 - alpha) / trials)
    assert all(rate <= limit for rate in study.rejection_rate.values()), study.rejection_rate
    assert study.p_values["mod"].shape == (trials,)


def test_power_study_is_deterministic_and_detects_a_scale_shift():
    kwargs = dict(n=30, m=30, trials=6, n_permutations=50, seed=1, tests=("mmd", "mod"))
    first = mt.power_study("scale", 50, 1.5, **kwargs)
    again = mt.power_study("scale", 50, 1.5, **kwargs)
    assert first.rejection_rate == again.rejection_rate
    np.testing.assert_array_equal(first.p_values["mod"], again.p_values["mod"])
    assert first.rejection_rate["mod"] == 1.0
    assert first.standard_error["mod"] == 0.0


# ------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "labels, error, message",
    [
        (np.ones(21), ValueError, "vector of length 22"),
        (np.r_[np.ones(11), 2 * np.ones(11)], ValueError, "0/1 or boolean"),
        (np.r_[1, np.zeros(21)], ValueError, "at least two points"),
        (np.ones((22, 1)), ValueError, "vector of length 22"),
        ([1] * 11 + [0] * 11, TypeError, "numpy array or tensor"),
    ],
)
def test_bad_labels_raise(unequal, labels, error, message):
    K = gaussian_gram(unequal[2])
    with pytest.raises(error, match=message):
        mt.mod_statistic(K, labels)


@pytest.mark.parametrize(
    "K, error, message",
    [
        (np.ones((4, 5)), ValueError, "square"),
        (np.eye(3), ValueError, "at least 4"),
        (np.array([[1.0, 2, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]), ValueError, "sym"),
        (np.diag([1.0, np.nan, 1, 1]), ValueError, "NaN or infinite"),
        (np.eye(4).tolist(), TypeError, "numpy array or tensor"),
        (np.eye(4, dtype=complex), TypeError, "real"),
    ],
)
def test_bad_kernel_matrices_raise(K, error, message):
    with pytest.raises(error, match=message):
        mt.mmd2_unbiased(K, np.array([1, 1, 0, 0]))


def test_moment_errors():
    K = gaussian_gram(np.random.default_rng(0).standard_normal((10, 2)))
    with pytest.raises(ValueError, match="does not match the kernel size"):
        mt.permutation_moments(K, 4, 5)
    with pytest.raises(ValueError, match="constant off the diagonal"):
        mt.difference_moments(np.ones((10, 10)), 5, 5)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"tests": ("mmd", "t-test")}, ValueError, "unknown tests"),
        ({"tests": "mmd"}, TypeError, "sequence of test names"),
        ({"tests": ("mod", "mod")}, ValueError, "repeated"),
        ({"alpha": 0.0}, ValueError, r"alpha must lie in \(0, 1\)"),
        ({"alpha": 1.5}, ValueError, r"alpha must lie in \(0, 1\)"),
        ({"n_permutations": 0}, ValueError, "n_permutations must be at least 1"),
        ({"n_permutations": 10.0}, TypeError, "n_permutations must be an integer"),
        ({"seed": -1}, ValueError, "seed must be at least 0"),
        ({"bank": [("gauss", -1.0)]}, ValueError, "finite and positive"),
    ],
)
def test_two_sample_test_rejects_bad_options(unequal, kwargs, error, message):
    X, Y, _, _ = unequal
    with pytest.raises(error, match=message):
        mt.two_sample_test(X, Y, **kwargs)


@pytest.mark.parametrize(
    "X, Y, message",
    [
        (np.zeros((5, 2)), np.zeros((5, 3)), "same number of features"),
        (np.zeros((1, 2)), np.zeros((5, 2)), "at least two points"),
        (np.full((5, 2), np.nan), np.zeros((5, 2)), "NaN or infinite"),
    ],
)
def test_two_sample_test_rejects_bad_samples(X, Y, message):
    with pytest.raises(ValueError, match=message):
        mt.two_sample_test(X, Y)


def test_mmd2_permutation_sd_matches_monte_carlo_and_scales_like_one_over_n():
    import torch

    from icml26.data import two_sample
    from icml26.kernels import gaussian_kernel, median_distance, pairwise_distances

    X, Y = two_sample("null", 30, 45, 4, seed=3)
    Z = torch.cat([torch.from_numpy(X), torch.from_numpy(Y)])
    K = gaussian_kernel(pairwise_distances(Z), median_distance(Z))
    exact = mt.mmd2_permutation_sd(K, 30, 45).item()
    stats = mt.permutation_statistics(K, 30, 45, 4000, torch.Generator().manual_seed(1))
    values = stats.mmd2[0, 1:]
    se = values.std().item() / (2 * (len(values) - 1)) ** 0.5
    assert abs(values.std().item() - exact) < 4 * se
    assert abs(values.mean().item()) < 4 * values.std().item() / len(values) ** 0.5
    # D_X + D_Y: the linear parts cancel, so the sd is far below that of D_X
    _, diff_sd = mt.difference_moments(K, 30, 45)
    assert exact < 0.5 * diff_sd[0].item()
    with pytest.raises(ValueError):
        mt.mmd2_permutation_sd(torch.ones(6, 6), 3, 3)


def test_mmd_fuse_exponent_matches_the_reference_quadratic_form():
    """For n = m, lambda MMD^2_u / N_l equals the exponent of the reference mmdfuse code."""
    X, Y = two_sample("scale", 11, 11, 3, 1.3, seed=4)
    Z = torch.cat([torch.from_numpy(X), torch.from_numpy(Y)])
    bank = kernel_bank(Z, DEFAULT_BANK_SPECS)
    n = m = 11
    v10 = torch.cat([torch.ones(n), torch.zeros(m)]).double()
    v01 = torch.cat([torch.zeros(n), -torch.ones(m)]).double()
    v11 = v10 + v01
    labels = mt.first_n_labels(n, m)
    for K in bank.matrices:
        K0 = mt.zero_diagonal(K)
        quadratic = (v10 @ K0 @ v10 * (n - m + 1) * (n - 1) / (m * (m - 1))
                     + v01 @ K0 @ v01 * (m - n + 1) / m + v11 @ K0 @ v11 * (n - 1) / m)
        reference = quadratic / torch.sqrt((K0**2).sum()) * math.sqrt(n * (n - 1))
        ours = (mt.fuse_temperature(n, m) * mt.mmd2_unbiased(K, labels)
                / mt.fuse_normalisers(K[None])[0])
        assert ours.item() == pytest.approx(reference.item(), rel=1e-10)
