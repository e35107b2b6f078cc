"""Tests for the active-ustatistics chapter: exact identities, brute force, scipy, Monte Carlo."""

import itertools

import numpy as np
import pytest
from scipy import optimize, stats

from icml26 import active_ustatistics as au
from icml26.active_ustatistics.estimators import gini_row_sums, prediction_row_sums
from icml26.active_ustatistics.ranking import ranking_score_parts


def scalar_gini(u, v):
    return abs(u - v)


def scalar_kendall(u, v):
    return np.sign(u[0] - v[0]) * np.sign(u[1] - v[1])


def aipw_by_loops(labels, predictions, pi, sampled, kernel):
    """Eq. (eq-pair-expansion) summed over ordered pairs; also returns the row means psi_i."""
    n = len(labels)
    w = np.where(sampled, 1 / pi, 0.0)
    psi = np.zeros(n)
    for i, j in itertools.permutations(range(n), 2):
        psi[i] += ((1 - w[i]) * (1 - w[j]) * kernel(predictions[i], predictions[j])
                   + w[i] * (1 - w[j]) * kernel(labels[i], predictions[j])
                   + (1 - w[i]) * w[j] * kernel(predictions[i], labels[j])
                   + w[i] * w[j] * kernel(labels[i], labels[j]))
    psi /= n - 1
    return psi.mean(), np.sqrt(4 * psi.var(ddof=1) / n)


@pytest.fixture
def population():
    rng = np.random.default_rng(7)
    n = 70
    a = rng.standard_normal(n)
    y = a + rng.standard_normal(n)
    y_hat = a + 0.3 * rng.standard_normal(n)
    pi = rng.uniform(0.15, 1.0, n)
    sampled = rng.uniform(size=n) < pi
    return a, y, y_hat, pi, sampled


# ------------------------------------------------------------------ full-label U-statistics


def test_gini_mean_difference_matches_double_loop():
    y = np.random.default_rng(0).exponential(size=150)
    loop = np.mean([abs(y[i] - y[j]) for i, j in itertools.permutations(range(150), 2)])
    assert au.gini_mean_difference(y) == pytest.approx(loop, rel=1e-12)
    assert au.full_ustatistic(y, au.gini_kernel).estimate == pytest.approx(loop, rel=1e-12)


def test_kendall_matches_scipy_without_ties_and_brute_force_with_ties():
    rng = np.random.default_rng(1)
    a, y = rng.standard_normal(300), rng.standard_normal(300)
    y = y + 0.5 * a
    records = au.kendall_records(a, y)
    assert au.full_ustatistic(records, au.kendall_kernel).estimate == pytest.approx(
        stats.kendalltau(a, y).statistic, rel=1e-12)
    a_tied, y_tied = rng.integers(0, 5, 120).astype(float), rng.integers(0, 4, 120).astype(float)
    brute = np.mean([np.sign(a_tied[i] - a_tied[j]) * np.sign(y_tied[i] - y_tied[j])
                     for i, j in itertools.permutations(range(120), 2)])
    assert au.kendall_tau_a(a_tied, y_tied) == pytest.approx(brute, rel=1e-12)
    assert au.full_ustatistic(au.kendall_records(a_tied, y_tied),
                              au.kendall_kernel).estimate == pytest.approx(brute, rel=1e-12)


def test_full_ustatistic_standard_error_is_the_hajek_formula():
    y = np.random.default_rng(2).standard_normal(60)
    psi = np.array([np.mean([abs(y[i] - y[j]) for j in range(60) if j != i]) for i in range(60)])
    assert au.full_ustatistic(y, au.gini_kernel).std_error == pytest.approx(
        np.sqrt(4 * psi.var(ddof=1) / 60), rel=1e-12)


def test_gini_row_sums_match_brute_force():
    rng = np.random.default_rng(3)
    points, reference = rng.standard_normal(40), rng.standard_normal(55)
    brute = np.abs(points[:, None] - reference[None, :]).sum(axis=1)
    assert np.allclose(gini_row_sums(points, reference), brute, rtol=1e-12)
    assert np.allclose(au.SortedProjection(reference)(points), brute / 55, rtol=1e-12)


# ------------------------------------------------------------------ the AIPW U-statistic


def test_all_labels_give_the_full_label_ustatistic(population):
    a, y, y_hat, _, _ = population
    everyone = np.ones(len(y), bool)
    gini = au.aipw_ustatistic(y, y_hat, np.ones(len(y)), everyone, au.gini_kernel)
    assert gini.estimate == pytest.approx(au.gini_mean_difference(y), rel=1e-12)
    assert gini.std_error == pytest.approx(au.full_ustatistic(y, au.gini_kernel).std_error)
    kendall = au.aipw_ustatistic(au.kendall_records(a, y), au.kendall_records(a, y_hat),
                                 np.ones(len(y)), everyone, au.kendall_kernel)
    assert kendall.estimate == pytest.approx(au.kendall_tau_a(a, y), rel=1e-12)


def test_no_labels_give_the_prediction_only_ustatistic(population):
    _, y, y_hat, pi, _ = population
    nobody = np.zeros(len(y), bool)
    result = au.aipw_ustatistic(np.full(len(y), np.nan), y_hat, pi, nobody, au.gini_kernel)
    assert result.estimate == pytest.approx(au.gini_mean_difference(y_hat), rel=1e-12)
    assert result.n_labels == 0


@pytest.mark.parametrize("kind", ["gini", "kendall"])
def test_aipw_estimate_and_standard_error_match_double_loop(population, kind):
    a, y, y_hat, pi, sampled = population
    observed = np.where(sampled, y, np.nan)
    if kind == "gini":
        labels, predictions, kernel, scalar = observed, y_hat, au.gini_kernel, scalar_gini
        loop_labels, loop_predictions = y, y_hat
    else:
        labels, predictions = au.kendall_records(a, observed), au.kendall_records(a, y_hat)
        kernel, scalar = au.kendall_kernel, scalar_kendall
        loop_labels, loop_predictions = au.kendall_records(a, y), predictions
    estimate, std_error = aipw_by_loops(loop_labels, loop_predictions, pi, sampled, scalar)
    result = au.aipw_ustatistic(labels, predictions, pi, sampled, kernel)
    assert result.estimate == pytest.approx(estimate, rel=1e-11)
    assert result.std_error == pytest.approx(std_error, rel=1e-10)
    assert result.n_labels == sampled.sum()


def test_shared_prediction_sums_and_the_gini_shortcut_agree_with_the_generic_path(population):
    _, y, y_hat, pi, sampled = population
    observed = np.where(sampled, y, np.nan)
    generic = lambda u, v: au.gini_kernel(u, v)  # noqa: E731 (not the same object: no shortcut)
    shortcut = prediction_row_sums(y_hat, au.gini_kernel)
    assert np.allclose(shortcut, prediction_row_sums(y_hat, generic), rtol=1e-12)
    with_shared = au.aipw_ustatistic(observed, y_hat, pi, sampled, au.gini_kernel, shortcut)
    plain = au.aipw_ustatistic(observed, y_hat, pi, sampled, generic)
    assert with_shared.estimate == pytest.approx(plain.estimate, rel=1e-12)


def test_the_mean_kernel_shortcut_agrees_with_the_generic_path(population):
    _, y, y_hat, pi, sampled = population
    generic = lambda u, v: au.mean_kernel(u, v)  # noqa: E731 (not the same object: no shortcut)
    shortcut = prediction_row_sums(y_hat, au.mean_kernel)
    assert np.allclose(shortcut, prediction_row_sums(y_hat, generic), rtol=1e-12)


def test_paired_study_outputs_are_per_replicate():
    result = au.StudyResult(truth=1.0, budget=10, level=0.9)
    for estimate, std_error in ((1.5, 1.0), (0.0, 0.1)):
        result.add("a", au.UStatEstimate(estimate, std_error, 3))
    assert np.allclose(result.squared_errors("a"), [0.25, 1.0])
    assert result.covered("a").tolist() == [True, False]
    assert result.mse("a") == pytest.approx(0.625) and result.coverage("a") == 0.5


def test_chunked_kernel_products_match_a_single_block(population, monkeypatch):
    _, y, y_hat, pi, sampled = population
    observed = np.where(sampled, y, np.nan)
    generic = lambda u, v: au.gini_kernel(u, v)  # noqa: E731
    whole = au.aipw_ustatistic(observed, y_hat, pi, sampled, generic).estimate
    monkeypatch.setattr("icml26.active_ustatistics.estimators.CHUNK_ENTRIES", 7)
    assert au.aipw_ustatistic(observed, y_hat, pi, sampled, generic).estimate == pytest.approx(
        whole, rel=1e-12)


def test_mean_kernel_reduces_to_the_active_mean_estimator(population):
    _, y, y_hat, pi, sampled = population
    w = np.where(sampled, 1 / pi, 0.0)
    result = au.aipw_ustatistic(np.where(sampled, y, np.nan), y_hat, pi, sampled, au.mean_kernel)
    assert abs(result.estimate - np.mean(y_hat + w * (y - y_hat))) < 1e-12


def test_aipw_is_unbiased_for_the_full_label_ustatistic_over_sampling_draws():
    rng = np.random.default_rng(11)
    n, draws = 150, 3000
    y = rng.exponential(size=n)
    y_hat = 0.3 * y + 1.0 + 0.1 * rng.standard_normal(n)  # a deliberately poor predictor
    pi = au.practical_inclusion(rng.uniform(size=n), 30, tau=0.2)
    estimates = []
    for _ in range(draws):
        sampled = rng.uniform(size=n) < pi
        estimates.append(au.aipw_ustatistic(np.where(sampled, y, np.nan), y_hat, pi, sampled,
                                            au.gini_kernel).estimate)
    target = au.gini_mean_difference(y)
    assert abs(np.mean(estimates) - target) < 4 * np.std(estimates) / np.sqrt(draws)
    assert abs(au.gini_mean_difference(y_hat) - target) > 0.2  # the plug-in alone is far off


def test_intervals_cover_at_the_nominal_rate_in_a_superpopulation():
    design = au.SyntheticDesign(heteroscedastic=True)
    world = au.synthetic_worlds(design, [au.GINI], n_train=600, n_pilot=400, n_pool=20_000,
                                seed=5)[au.GINI.name]
    result = au.run_study(world, au.standard_designs(0.2, oracle=True), n=600, budget=80,
                          replicates=300, seed=6)
    for name in ("classical", "uniform", "active", "oracle"):
        assert 0.84 <= result.coverage(name) <= 0.96, name
    assert result.mse("active") < result.mse("uniform")
    assert result.summary().loc["classical", "ESS"] == pytest.approx(80)


def test_interval_uses_the_normal_quantile():
    estimate = au.UStatEstimate(1.0, 0.5, 10)
    low, high = estimate.interval(0.9)
    assert high - 1.0 == pytest.approx(stats.norm.ppf(0.95) * 0.5)
    assert low == pytest.approx(2.0 - high)
    assert estimate.covers(1.8) and not estimate.covers(1.9)


# ------------------------------------------------------------------ sampling rules


def test_water_filling_spends_the_budget_and_solves_the_constrained_problem():
    e = np.geomspace(1e-3, 10, 25)
    pi = au.water_filling(np.sqrt(e), 9)
    assert pi.sum() == pytest.approx(9) and np.all((pi > 0) & (pi <= 1))
    assert np.sum(pi == 1) > 0
    uncapped = pi < 1
    assert np.allclose(pi[uncapped] / np.sqrt(e[uncapped]), (pi / np.sqrt(e))[uncapped][0])
    solver = optimize.minimize(
        lambda p: np.sum(e / p), np.full(25, 9 / 25), jac=lambda p: -e / p**2, method="SLSQP",
        bounds=[(1e-6, 1)] * 25, constraints={"type": "eq", "fun": lambda p: p.sum() - 9},
        options={"ftol": 1e-12, "maxiter": 500})
    assert np.sum(e / pi) <= solver.fun + 1e-6


def test_water_filling_beats_random_feasible_rules():
    rng = np.random.default_rng(4)
    e = rng.gamma(0.7, size=50)
    best = np.sum(e / au.water_filling(np.sqrt(e), 12))
    for _ in range(200):
        other = au.water_filling(rng.uniform(size=50), 12)
        assert best <= np.sum(e / other) + 1e-9


def test_uniform_scores_give_the_uniform_rule_and_mixing_keeps_the_budget():
    assert np.allclose(au.water_filling(np.ones(40), 10), 0.25)
    pi = au.water_filling(np.r_[np.zeros(30), np.ones(10)], 20)
    assert np.array_equal(pi, np.r_[np.zeros(30), np.ones(10)])  # too few positive scores
    mixed = au.mix_with_uniform(au.water_filling(np.arange(40.0), 10), 10, 0.2)
    assert mixed.sum() == pytest.approx(10) and mixed.min() == pytest.approx(0.2 * 10 / 40)
    assert np.all(au.practical_inclusion(np.r_[-1.0, np.ones(39)], 10) > 0)


def test_poisson_sampling_has_the_right_inclusion_rate():
    rng = np.random.default_rng(8)
    pi = au.practical_inclusion(rng.uniform(size=200), 40)
    counts = np.zeros(200)
    for _ in range(2000):
        counts += au.poisson_sample(pi, rng.uniform(size=200))
    frequencies = counts / 2000
    assert np.all(np.abs(frequencies - pi) < 5 * np.sqrt(pi * (1 - pi) / 2000) + 1e-9)


def test_plugin_projection_is_the_reference_average():
    reference = np.random.default_rng(9).standard_normal(30)
    projection = au.plugin_projection(au.gini_kernel, reference)
    points = np.array([-1.0, 0.0, 2.5])
    assert np.allclose(projection(points), [np.mean(np.abs(p - reference)) for p in points])


def test_oracle_scores_match_monte_carlo():
    design = au.SyntheticDesign(heteroscedastic=True)
    rng = np.random.default_rng(10)
    _, y_ref = design.sample(50_000, rng)
    g = au.SortedProjection(y_ref)
    scores = au.simulation.gini_oracle_scores(design, g)
    X = rng.uniform(size=(3, 5))
    predictions = design.mean(X) + 0.1
    noise = rng.standard_normal((20_000, 1))
    draws = design.mean(X)[None, :] + design.noise_sd(X)[None, :] * noise
    monte_carlo = np.sqrt(np.mean((g(draws) - g(predictions)[None, :]) ** 2, axis=0))
    assert np.allclose(scores(X, predictions), monte_carlo, rtol=0.03)


# ------------------------------------------------------------------ ranking (U-statistic ERM)


def test_sign_matrix_matches_the_four_atom_expansion(population):
    _, y, y_hat, pi, sampled = population
    signs = au.aipw_sign_matrix(np.where(sampled, y, np.nan), y_hat, pi, sampled)
    w = np.where(sampled, 1 / pi, 0.0)
    for i, j in [(0, 1), (5, 9), (20, 3)]:
        expected = ((1 - w[i]) * (1 - w[j]) * np.sign(y_hat[i] - y_hat[j])
                    + w[i] * (1 - w[j]) * np.sign(y[i] - y_hat[j])
                    + (1 - w[i]) * w[j] * np.sign(y_hat[i] - y[j])
                    + w[i] * w[j] * np.sign(y[i] - y[j]))
        assert signs[i, j] == pytest.approx(expected)
    assert np.allclose(signs, -signs.T) and np.all(np.diag(signs) == 0)


def test_full_label_ranking_fit_minimises_the_pairwise_logistic_loss():
    rng = np.random.default_rng(12)
    X = rng.standard_normal((60, 2))
    y = X @ np.array([1.0, -1.0]) + rng.gumbel(size=60)
    fit = au.fit_pairwise_ranking(X, y, y, np.ones(60), np.ones(60, bool))

    def risk(beta):
        t = (X @ beta)[:, None] - (X @ beta)[None, :]
        s = np.sign(y[:, None] - y[None, :])
        off = ~np.eye(60, dtype=bool)
        return np.mean(np.logaddexp(0, -s * t)[off])

    direct = optimize.minimize(risk, np.zeros(2), method="BFGS", options={"gtol": 1e-10})
    assert np.allclose(fit.beta, direct.x, atol=1e-5)


def test_ranking_hessian_matches_finite_differences_of_the_score():
    rng = np.random.default_rng(13)
    X = rng.standard_normal((30, 2))
    signs = np.sign(rng.standard_normal((30, 30)))
    signs = np.triu(signs, 1) - np.triu(signs, 1).T
    beta, step = np.array([0.4, -0.2]), 1e-6
    _, hessian = ranking_score_parts(X, beta, signs)
    columns = [(ranking_score_parts(X, beta + step * e, signs)[0].mean(0)
                - ranking_score_parts(X, beta - step * e, signs)[0].mean(0)) / (2 * step)
               for e in np.eye(2)]
    assert np.allclose(hessian, np.column_stack(columns), atol=1e-6)


def test_ranking_fit_is_consistent_in_a_correctly_specified_model():
    rng = np.random.default_rng(14)
    beta_star = np.array([1.0, -0.5])
    X = rng.standard_normal((700, 2))
    y = X @ beta_star + rng.gumbel(size=700)
    y_hat = X @ beta_star + np.euler_gamma  # the conditional mean of y
    pi = np.full(700, 0.4)
    sampled = rng.uniform(size=700) < pi
    fit = au.fit_pairwise_ranking(X, np.where(sampled, y, np.nan), y_hat, pi, sampled)
    z = (fit.beta - beta_star) / np.sqrt(np.diag(fit.covariance))
    assert np.all(np.abs(z) < 4)
    low, high = fit.interval(0, 0.9)
    assert low < fit.beta[0] < high


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize("bad_pi", [0.0, -0.1, 1.2, np.nan])
def test_inclusion_probabilities_outside_zero_one_are_rejected(population, bad_pi):
    _, y, y_hat, pi, sampled = population
    pi = pi.copy()
    pi[3] = bad_pi
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        au.aipw_ustatistic(np.where(sampled, y, np.nan), y_hat, pi, sampled, au.gini_kernel)


@pytest.mark.parametrize("budget", [0, -5, 101, 1e9])
def test_budgets_outside_zero_n_are_rejected(budget):
    with pytest.raises(ValueError, match="budget"):
        au.uniform_inclusion(100, budget)
    with pytest.raises(ValueError, match="budget"):
        au.water_filling(np.ones(100), budget)
    with pytest.raises(ValueError, match="budget"):
        au.practical_inclusion(np.ones(100), budget)


def test_non_numeric_budget_is_a_type_error():
    with pytest.raises(TypeError):
        au.check_budget("10", 100)


def test_mismatched_lengths_are_rejected(population):
    _, y, y_hat, pi, sampled = population
    observed = np.where(sampled, y, np.nan)
    with pytest.raises(ValueError, match="differ"):
        au.aipw_ustatistic(observed, y_hat[:-1], pi, sampled, au.gini_kernel)
    with pytest.raises(ValueError, match="shape"):
        au.aipw_ustatistic(observed, y_hat, pi[:-1], sampled, au.gini_kernel)
    with pytest.raises(ValueError, match="shape"):
        au.aipw_ustatistic(observed, y_hat, pi, sampled[:-1], au.gini_kernel)
    with pytest.raises(ValueError, match="differ"):
        au.poisson_sample(pi, np.zeros(3))
    with pytest.raises(ValueError):
        au.kendall_records(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="rows"):
        au.fit_pairwise_ranking(np.zeros((5, 2)), y, y_hat, pi, sampled)


def test_nan_labels_among_sampled_units_are_rejected(population):
    _, y, y_hat, pi, sampled = population
    observed = np.where(sampled, y, np.nan)
    observed[np.flatnonzero(sampled)[0]] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        au.aipw_ustatistic(observed, y_hat, pi, sampled, au.gini_kernel)
    with pytest.raises(ValueError, match="NaN"):
        au.classical_ustatistic(observed, sampled, au.gini_kernel)
    with pytest.raises(ValueError, match="NaN"):
        au.aipw_sign_matrix(observed, y_hat, pi, sampled)


def test_other_bad_inputs(population):
    _, y, y_hat, pi, sampled = population
    observed = np.where(sampled, y, np.nan)
    with pytest.raises(TypeError, match="boolean"):
        au.aipw_ustatistic(observed, y_hat, pi, sampled.astype(int), au.gini_kernel)
    with pytest.raises(ValueError, match="NaN"):
        au.aipw_ustatistic(observed, np.full_like(y_hat, np.nan), pi, sampled, au.gini_kernel)
    with pytest.raises(ValueError, match="non-negative"):
        au.water_filling(np.r_[-1.0, np.ones(9)], 3)
    with pytest.raises(ValueError, match="tau"):
        au.mix_with_uniform(np.full(10, 0.3), 3, 1.5)
    with pytest.raises(ValueError, match="level"):
        au.UStatEstimate(0.0, 1.0, 3).interval(1.0)
    with pytest.raises(ValueError, match="at least 3"):
        au.classical_ustatistic(observed, np.zeros(len(y), bool), au.gini_kernel)
    with pytest.raises(ValueError, match="at least 2"):
        au.gini_mean_difference([1.0])
