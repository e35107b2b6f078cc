"""Tests for the interventional-gp chapter: closed forms against Monte Carlo, scikit-learn and
gpytorch, brute-force averaging, calibration without the truth, and bad input."""

import inspect

import numpy as np
import pytest
import torch
from scipy import stats
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel
from sklearn.kernel_ridge import KernelRidge

from icml26.interventional_gp import calibration as cal
from icml26.interventional_gp import experiments as ex
from icml26.interventional_gp import simulators as sim
from icml26.interventional_gp.baselines import (
    fit_sampling_stage,
    sampling_gp_inner_sweep,
    sampling_gp_moments,
)
from icml26.interventional_gp.cbo import BOTrace, bayes_opt, causal_prior, expected_improvement
from icml26.interventional_gp.kernels import (
    DTYPE,
    GaussianKernel,
    GaussianMeasure,
    data_measure,
    integral_operator_gram,
    kernel_chain_gram,
    kernel_chain_trace,
)
from icml26.interventional_gp.posterior import (
    FusedData,
    GPStage,
    ImpspecPosterior,
    Intervention,
    bayesimp_code_moments,
    bayesimp_moments,
    outcome_posterior,
    treatment_weights,
)
from icml26.interventional_gp.spectral import (
    gaussian_mercer_eigenvalues,
    nystrom_basis,
    spectral_draws,
)
from icml26.interventional_gp.training import (
    outcome_gpytorch_model,
    treatment_objective,
)


@pytest.fixture
def kernel_and_measure():
    kernel = GaussianKernel(torch.tensor([0.7, 1.3]), 1.7)
    measure = GaussianMeasure(torch.tensor([0.2, -0.1]), torch.tensor([0.8, 1.1]))
    return kernel, measure


@pytest.fixture(scope="module")
def chain_fit():
    """A small mediator chain with fitted IMPspec stages (d = 2 keeps Nyström accurate)."""
    chain = sim.mediator_chain(80, 2, 0.5, seed=3, grid_size=8)
    data = chain.observed()
    fit = ex.fit_impspec(data, chain.intervention(), max_iter=60)
    return chain, data, fit


def points(n, d, seed):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal((n, d)))


# ------------------------------------------------------------------ closed-form integrals


def test_integral_operator_matches_unbiased_monte_carlo(kernel_and_measure):
    kernel, measure = kernel_and_measure
    X, Y = points(5, 2, 0), points(4, 2, 1)
    U = measure.sample(400_000, torch.Generator().manual_seed(0))
    terms = kernel.gram(X, U)[:, None, :] * kernel.gram(Y, U)[None, :, :]
    mc, se = terms.mean(-1), terms.std(-1) / np.sqrt(U.shape[0])
    exact = integral_operator_gram(kernel, measure, X, Y)
    assert (exact - mc).abs().max() < 5 * se.max()
    assert torch.allclose(kernel_chain_gram(kernel, measure, X, Y, depth=1), exact, atol=1e-14)
    assert torch.allclose(kernel_chain_gram(kernel, measure, X, Y, depth=0), kernel.gram(X, Y))


def test_integral_operator_is_symmetric_psd(kernel_and_measure):
    kernel, measure = kernel_and_measure
    X = points(60, 2, 2) * 2
    R = integral_operator_gram(kernel, measure, X)
    assert torch.equal(R, R.T)
    assert torch.linalg.eigvalsh(R).min() > -1e-12 * R.diagonal().max()


@pytest.mark.parametrize("depth", [2, 3])
def test_kernel_chains_match_monte_carlo_with_independent_draws(kernel_and_measure, depth):
    kernel, measure = kernel_and_measure
    X, Y = points(3, 2, 3), points(3, 2, 4)
    gen = torch.Generator().manual_seed(depth)
    draws = [measure.sample(1500, gen) for _ in range(depth)]
    chain = kernel.gram(X, draws[0]) / 1500
    for a, b in zip(draws, draws[1:], strict=False):
        chain = chain @ kernel.gram(a, b) / 1500
    chain = chain @ kernel.gram(draws[-1], Y)
    exact = kernel_chain_gram(kernel, measure, X, Y, depth=depth)
    assert (exact - chain).abs().max() < 0.05 * exact.abs().max()


def test_traces_match_their_integrals(kernel_and_measure):
    kernel, measure = kernel_and_measure
    assert kernel_chain_trace(kernel, measure, 0) == kernel.outputscale
    U, W = (measure.sample(200_000, torch.Generator().manual_seed(s)) for s in (5, 6))
    sq = (kernel.outputscale * torch.exp(-0.5 * (((U - W) / kernel.lengthscale) ** 2).sum(1))) ** 2
    closed = kernel.outputscale**2 * torch.prod(
        kernel.lengthscale / torch.sqrt(kernel.lengthscale**2 + 4 * measure.sd**2))
    trace = kernel_chain_trace(kernel, measure, 1)
    assert trace == pytest.approx(float(closed), rel=1e-12)
    assert abs(trace - sq.mean().item()) < 5 * sq.std().item() / np.sqrt(len(sq))


# ------------------------------------------------------------------ posterior moments


def test_closed_form_variance_matches_finite_spectral_basis(chain_fit):
    chain, data, fit = chain_fit
    for scale in (1.0, 4.0):
        basis = nystrom_basis(fit.outcome.kernel, fit.posterior.measure(scale), 1500, 300, seed=1)
        draws = spectral_draws(data, fit.outcome, fit.treatment, chain.intervention(), basis,
                               20_000, prior_power=1, seed=2)
        ratio = draws.var(0) / fit.posterior.variance(scale)
        assert (ratio - 1).abs().max() < 0.05, ratio
        assert (draws.mean(0) - fit.posterior.mean).abs().max() < 0.02


def test_exact_bayesimp_matches_finite_spectral_basis(chain_fit):
    chain, data, fit = chain_fit
    measure = data_measure(data.V1, 1.0)
    moments = bayesimp_moments(data, fit.outcome, fit.treatment, chain.intervention(), measure)
    variances = []
    for seed in range(4):  # average over Nyström bases: r's finite-basis error is larger
        basis = nystrom_basis(fit.outcome.kernel, measure, 1000, 300, seed=seed)
        draws = spectral_draws(data, fit.outcome, fit.treatment, chain.intervention(), basis,
                               10_000, prior_power=2, seed=10 + seed)
        variances.append(draws.var(0))
    ratio = torch.stack(variances).mean(0) / moments.variance
    assert (ratio - 1).abs().max() < 0.05, ratio
    code = bayesimp_code_moments(data, fit.outcome, fit.treatment, chain.intervention(), measure)
    assert torch.equal(code.mean, moments.mean) and torch.equal(code.terms.v3, moments.terms.v3)
    assert not torch.allclose(code.variance, moments.variance, rtol=1e-3)


def test_bayesimp_weights_variant_changes_only_the_norm_term(chain_fit):
    chain, data, fit = chain_fit
    measure, intervention = data_measure(data.V1, 1.0), chain.intervention()
    kernel_w = bayesimp_code_moments(data, fit.outcome, fit.treatment, intervention, measure)
    nuclear_w = bayesimp_code_moments(data, fit.outcome, fit.treatment, intervention, measure,
                                      weights="nuclear")
    assert torch.equal(kernel_w.terms.v2, nuclear_w.terms.v2)
    assert torch.equal(kernel_w.terms.v3, nuclear_w.terms.v3)
    # the norm term by brute force: alpha_r' R (K^-1 R)^2 alpha_r times kappa, with dense solves
    R = integral_operator_gram(fit.outcome.kernel, measure, data.V1)
    K = fit.outcome.kernel.gram(data.V1)
    eye = torch.eye(len(K), dtype=K.dtype)
    alpha_r = torch.linalg.solve(R + fit.outcome.noise * eye, data.Y)
    K_inv_R = torch.linalg.solve(K + 1e-4 * eye, R)
    _, kappa = treatment_weights(data, fit.treatment, intervention)
    expected = kappa * (alpha_r @ R @ K_inv_R @ K_inv_R @ alpha_r)
    assert torch.allclose(nuclear_w.terms.v1, expected, rtol=1e-6, atol=1e-10)
    with pytest.raises(ValueError, match="weights"):
        bayesimp_code_moments(data, fit.outcome, fit.treatment, intervention, measure,
                              weights="ridge")


def _sklearn_two_stage(data, outcome, treatment, grid):
    """KRR of Y on V, then KRR of the fitted f(V0) on A, with scikit-learn's KernelRidge."""
    def ridge(stage):
        return KernelRidge(alpha=stage.noise / stage.kernel.outputscale, kernel="rbf", gamma=0.5)

    ell_v, ell_a = outcome.kernel.lengthscale.numpy(), treatment.kernel.lengthscale.numpy()
    first = ridge(outcome).fit(data.V1.numpy() / ell_v, data.Y.numpy())
    f_v0 = first.predict(data.V0.numpy() / ell_v)
    second = ridge(treatment).fit(data.A.numpy() / ell_a, f_v0)
    return second.predict(np.asarray(grid) / ell_a)


@pytest.mark.parametrize("paired", [True, False])
def test_posterior_mean_is_two_stage_kernel_ridge(paired):
    rng = np.random.default_rng(5)
    A = rng.uniform(0, 1, (60, 1))
    V = np.column_stack([np.sin(6 * A[:, 0]), A[:, 0] ** 2]) + 0.1 * rng.standard_normal((60, 2))
    V1 = V if paired else V[::-1] + 0.05
    Y = np.sin(V1).sum(1) + 0.1 * rng.standard_normal(60)
    data = FusedData.single(A, V, Y) if paired else FusedData(A, V, V1, Y)
    outcome = GPStage(GaussianKernel(torch.tensor([0.6, 0.9]), 1.3), 0.05)
    treatment = GPStage(GaussianKernel(torch.tensor([0.15]), 0.8), 0.02)
    grid = np.linspace(0, 1, 25)[:, None]
    mean = ImpspecPosterior(data, outcome, treatment, Intervention(grid)).mean.numpy()
    np.testing.assert_allclose(mean, _sklearn_two_stage(data, outcome, treatment, grid),
                               atol=1e-6, rtol=0)


def test_outcome_posterior_agrees_with_gpytorch(chain_fit):
    _, data, fit = chain_fit
    X = points(30, 2, 7)
    mean, cov = outcome_posterior(data.V1, data.Y, fit.outcome, X)
    model, likelihood = outcome_gpytorch_model(data.V1, data.Y, fit.outcome)
    model.eval()
    likelihood.eval()
    with torch.no_grad():
        prediction = model(X)
    assert torch.allclose(mean, prediction.mean, atol=1e-8)
    assert torch.allclose(cov, prediction.covariance_matrix, atol=1e-8)


def test_outcome_fit_reaches_sklearn_marginal_likelihood(chain_fit):
    _, data, fit = chain_fit
    X, y = data.V1.numpy(), data.Y.numpy()
    kernel = ConstantKernel(1.0) * RBF(np.ones(2)) + WhiteKernel(0.1)
    sk = GaussianProcessRegressor(kernel, normalize_y=False, n_restarts_optimizer=2,
                                  random_state=0).fit(X, y)
    ours = np.log([fit.outcome.kernel.outputscale, *fit.outcome.kernel.lengthscale.numpy(),
                   fit.outcome.noise])
    ours_lml = sk.log_marginal_likelihood(ours)
    assert ours_lml >= sk.log_marginal_likelihood_value_ - 1e-3 * abs(ours_lml)


def test_averaged_intervention_matches_brute_force():
    rng = np.random.default_rng(8)
    A = torch.from_numpy(rng.standard_normal((15, 3)))
    kernel = GaussianKernel(torch.tensor([0.8, 1.2, 0.6]), 1.4)
    grid = torch.linspace(-1, 1, 6)[:, None]
    K_qA, K_qq = Intervention(grid, columns=(1,)).kernels(kernel, A)
    expanded = A.repeat(len(grid), 1)
    expanded[:, 1] = grid[:, 0].repeat_interleave(len(A))
    brute = kernel.gram(expanded, A).reshape(len(grid), len(A), len(A)).mean(1)
    assert torch.allclose(K_qA, brute, atol=1e-14)
    brute_qq = kernel.gram(expanded).reshape(len(grid), len(A), len(grid), len(A)).mean((1, 3))
    assert torch.allclose(K_qq, brute_qq, atol=1e-14)


def test_treatment_objective_is_the_eigenweighted_likelihood():
    """Eq. (22) equals sum_j lambda_j log N(w_j; 0, K) + const when G = sum_j lambda_j w_j w_j^T."""
    rng = np.random.default_rng(9)
    A = torch.from_numpy(rng.uniform(0, 1, (20, 1)))
    W = torch.from_numpy(rng.standard_normal((20, 4)))
    lam = torch.tensor([1.0, 0.5, 0.2, 0.05], dtype=DTYPE)
    G = (W * lam) @ W.T
    params = [torch.tensor([np.log(0.3)], dtype=DTYPE), torch.tensor(0.1, dtype=DTYPE),
              torch.tensor(np.log(0.05), dtype=DTYPE)]
    ours = treatment_objective(A, G, float(lam.sum()), *params).item() * 20
    K = np.exp(0.1) * np.exp(-0.5 * (A - A.T).numpy() ** 2 / 0.3**2) + (0.05 + 1e-6) * np.eye(20)
    logpdf = [stats.multivariate_normal(np.zeros(20), K).logpdf(W[:, j].numpy()) for j in range(4)]
    constant = 10 * np.log(2 * np.pi) * float(lam.sum())
    assert ours == pytest.approx(float((lam.numpy() * np.array(logpdf)).sum()) + constant,
                                 rel=1e-10)


# ------------------------------------------------------------------ simulators and baselines


def test_mediator_truth_matches_monte_carlo():
    chain = sim.mediator_chain(100, 5, 0.5, seed=1)
    exact, mc = chain.truth(), chain.monte_carlo_truth(40_000, seed=2)
    assert np.abs(exact - mc).max() < 0.02
    assert np.abs(exact - mc).max() < 0.1 * np.abs(exact).max()


def test_backdoor_truth_matches_monte_carlo():
    problem = sim.diabetes_backdoor(seed=0, grid_size=5)
    c, rng = sim.BACKDOOR, np.random.default_rng(1)
    a = problem.grid[:, 0][:, None, None]
    mu = (c["v_slope"] * np.tanh(a) + c["v_bmi"] * problem.W[None, :, 1, None]
          + c["v_age"] * problem.W[None, :, 0, None])
    V = mu + c["sd_v"] * rng.standard_normal((1, len(problem.W), 400))
    mc = (np.cos(c["y_freq"] * V) + c["y_slope"] * V).mean((1, 2))
    np.testing.assert_allclose(problem.truth(), mc, atol=0.01)


def test_sampling_baseline_agrees_with_impspec_on_an_easy_chain():
    chain = sim.mediator_chain(150, 1, 0.05, seed=4, grid_size=6)
    data, iv = chain.observed(), chain.intervention()
    fit = ex.fit_impspec(data, iv, max_iter=60)
    stage = fit_sampling_stage(data, max_iter=60)
    mean, var = sampling_gp_moments(data, fit.outcome, stage, iv, n_draws=40, n_inner=8, seed=0)
    # the edge of the grid carries a bias of about 0.14 (2000 draws); 40 draws add Monte Carlo
    # error, so the bound is 0.15 plus four of its standard errors
    mc_se = (var / 40).sqrt().numpy()
    assert (np.abs(mean.numpy() - chain.truth()) < 0.15 + 4 * mc_se).all()
    assert (var > 0).all()
    again = sampling_gp_moments(data, fit.outcome, stage, iv, n_draws=40, n_inner=8, seed=0)
    assert torch.equal(mean, again[0])


def _joint_sampler(data, outcome, stage, iv, n_draws, n_inner, seed):
    """Brute force: one joint draw of f at all N * M points (the grid-joint sampler)."""
    generator = torch.Generator().manual_seed(seed)
    beta, kappa = treatment_weights(data, stage, iv)
    mean_v = beta.T @ data.V0
    sd_g = torch.diagonal(kappa).clamp_min(0).sqrt()[:, None]
    N, d = mean_v.shape
    out = torch.empty(n_draws, N, dtype=DTYPE)
    for s in range(n_draws):
        g = mean_v + sd_g * torch.randn(N, d, dtype=DTYPE, generator=generator)
        V = (g[:, None, :] + stage.noise**0.5
             * torch.randn(N, n_inner, d, dtype=DTYPE, generator=generator)).reshape(-1, d)
        f_mean, f_cov = outcome_posterior(data.V1, data.Y, outcome, V)
        chol = torch.linalg.cholesky(f_cov + 1e-8 * torch.eye(len(V), dtype=DTYPE))
        f = f_mean + chol @ torch.randn(len(V), dtype=DTYPE, generator=generator)
        out[s] = f.reshape(N, n_inner).mean(1)
    return out.mean(0), out.var(0)


@pytest.fixture(scope="module")
def sampling_setup():
    chain = sim.mediator_chain(60, 2, 0.5, seed=5, grid_size=4)
    data, iv = chain.observed(), chain.intervention()
    fit = ex.fit_impspec(data, iv, max_iter=40)
    stage = fit_sampling_stage(data, max_iter=40)
    return data, iv, fit.outcome, stage


def test_per_point_sampler_matches_the_grid_joint_sampler(sampling_setup):
    """Marginal moments do not depend on whether draws are joint across the grid."""
    data, iv, outcome, stage = sampling_setup
    ours = sampling_gp_moments(data, outcome, stage, iv, n_draws=1500, n_inner=5, seed=1)
    brute = _joint_sampler(data, outcome, stage, iv, 1500, 5, seed=2)
    se_mean = (brute[1] / 1500).sqrt()
    assert ((ours[0] - brute[0]).abs() < 5 * se_mean).all()
    # the variance of a sample variance of 1500 near-Gaussian draws is ~ 2 var^2 / 1500
    ratio = ours[1] / brute[1]
    assert ((ratio - 1).abs() < 5 * (2 * 2 / 1500) ** 0.5).all(), ratio


def test_inner_draws_follow_the_law_of_total_variance(sampling_setup):
    data, iv, outcome, stage = sampling_setup
    sweep = sampling_gp_inner_sweep(data, outcome, stage, iv, n_draws=1500, inner=(1, 4, 40),
                                    seed=3, within=True, within_draws=300)
    v_inf = sweep[40][1] - sweep["within"] / 40
    for m in (1, 4):
        predicted = v_inf + sweep["within"] / m
        assert ((sweep[m][1] / predicted - 1).abs() < 0.25).all(), (m, sweep[m][1], predicted)
    # more inner draws, less variance, and the shared draws make the sweep paired
    assert (sweep[1][1] > sweep[40][1]).all()
    again = sampling_gp_inner_sweep(data, outcome, stage, iv, n_draws=1500, inner=(1, 4, 40),
                                    seed=3)
    assert torch.equal(again[4][0], sweep[4][0])


def test_sampling_sweep_rejects_bad_input(sampling_setup):
    data, iv, outcome, stage = sampling_setup
    for bad in ((), (0,), (2.5,), (True,)):
        with pytest.raises(ValueError, match="inner draw counts"):
            sampling_gp_inner_sweep(data, outcome, stage, iv, 10, bad)
    with pytest.raises(ValueError, match="n_draws"):
        sampling_gp_inner_sweep(data, outcome, stage, iv, 1, (2,))
    with pytest.raises(ValueError, match="within-draw"):
        sampling_gp_inner_sweep(data, outcome, stage, iv, 10, (1,), within=True)
    with pytest.raises(ValueError, match="n_inner"):
        sampling_gp_moments(data, outcome, stage, iv, 10, 0)


@pytest.mark.parametrize("sd", [0.3, 1.0, 2.5])
def test_mercer_eigenvalues_match_nystrom_and_sum_to_tau(sd):
    kernel = GaussianKernel(torch.tensor([0.6]), 1.4)
    basis = nystrom_basis(kernel, GaussianMeasure(torch.zeros(1), torch.tensor([sd])), 3000, 6,
                          seed=0)
    closed = gaussian_mercer_eigenvalues(6, 0.6, 1.4, sd)
    assert torch.allclose(basis.eigenvalues[:4], closed[:4], rtol=0.08)
    assert abs(gaussian_mercer_eigenvalues(400, 0.6, 1.4, sd).sum().item() - 1.4) < 1e-6
    with pytest.raises(ValueError):
        gaussian_mercer_eigenvalues(0, 0.6, 1.4, sd)
    with pytest.raises(ValueError):
        gaussian_mercer_eigenvalues(3, -0.6, 1.4, sd)


# ------------------------------------------------------------------ calibration and BO


def test_summarise_means_and_standard_errors_match_scipy():
    rng = np.random.default_rng(3)
    coverages = rng.uniform(size=(5, 7))
    results = [ex.SeedResult(seed, {"m": ex.Metrics(0.1 * seed, cov, float(cov.mean()))}, 1.0,
                             {"causal": BOTrace(np.arange(3), rng.uniform(size=3))}, {"fit": 1.0})
               for seed, cov in enumerate(coverages)]
    summary = ex.summarise(results)
    np.testing.assert_allclose(summary.coverage["m"], coverages.mean(0))
    np.testing.assert_allclose(summary.coverage_se["m"], stats.sem(coverages, axis=0))
    assert summary.score_se["m"] == pytest.approx(stats.sem(coverages.mean(1)))
    assert np.isnan(ex.summarise(results[:1]).coverage_se["m"]).all()
    with pytest.raises(ValueError, match="no seeds"):
        ex.summarise([])
    # later seeds without method "m2", a BO trace or a stage: averaged over the seeds that have it
    extra = ex.SeedResult(9, {"m": ex.Metrics(0.0, coverages[0], 0.5)}, 1.0, {}, {})
    both = [ex.SeedResult(r.seed, dict(r.metrics, m2=r.metrics["m"]), r.scale, r.bo, r.seconds)
            for r in results]
    mixed = ex.summarise([*both, extra])
    assert mixed.score["m2"] == pytest.approx(summary.score["m"])
    assert mixed.score["m"] == pytest.approx((5 * summary.score["m"] + 0.5) / 6)
    np.testing.assert_allclose(mixed.regret["causal"], summary.regret["causal"])
    assert mixed.seconds == {"fit": 1.0}


def test_misplaced_target_puts_the_maximum_where_the_prior_mean_is_lowest():
    grid = np.linspace(-2, 2, 41)
    truth = np.sin(grid)
    target = ex.misplaced_target(truth, truth, grid)  # prior mean = theta, lowest near -pi/2
    assert np.argmax(target) == np.argmin(truth) == 4
    # the new maximum beats the old one by half the range of theta
    assert target.max() == pytest.approx(truth.max() + 0.5 * np.ptp(truth))
    far = np.abs(grid - grid[4]) > 2.4  # six bump sds away: unchanged to 1e-6
    np.testing.assert_allclose(target[far], truth[far], atol=1e-6 * np.ptp(truth))
    # a prior mean that disagrees with theta moves the bump to its own minimum
    moved = ex.misplaced_target(truth, -truth, grid)
    assert np.argmax(moved) == np.argmax(truth)
    assert moved.max() == pytest.approx(truth.max() + 0.5 * np.ptp(truth))


def test_coverage_and_score_on_a_known_gaussian():
    rng = np.random.default_rng(10)
    truth = rng.standard_normal(20_000)
    coverage = cal.coverage_curve(truth, np.zeros_like(truth), np.ones_like(truth))
    assert np.abs(coverage - cal.LEVELS).max() < 0.015
    assert cal.calibration_score(coverage) < 0.01
    assert cal.calibration_score(cal.coverage_curve(truth, 0 * truth, 0 * truth)) > 0.45


def test_calibration_never_reads_the_ground_truth(monkeypatch):
    chain = sim.mediator_chain(40, 2, 0.5, seed=0, grid_size=6)
    assert "truth" not in inspect.signature(cal.calibrate_measure_scale).parameters

    def forbidden(*args, **kwargs):
        raise AssertionError("the ground truth was read during fitting")

    monkeypatch.setattr(sim, "chain_effect", forbidden)
    fit = ex.fit_methods(chain.observed(), chain.intervention(), max_iter=30, n_boot=3,
                         scales=(0.5, 1.0, 2.0), methods=("impspec_cal", "impspec"))
    monkeypatch.undo()
    assert fit.calibration.scale in (0.5, 1.0, 2.0)
    assert fit.calibration.coverage.shape == (3, 6, len(cal.LEVELS))
    with pytest.raises(AssertionError):
        monkeypatch.setattr(sim, "chain_effect", forbidden)
        chain.truth()


def test_expected_improvement_matches_monte_carlo():
    rng = np.random.default_rng(11)
    mean, sd, best = np.array([0.3, -0.2, 1.0, 0.5]), np.array([0.5, 1.0, 0.1, 0.0]), 0.4
    draws = mean + sd * rng.standard_normal((400_000, 4))
    mc = np.maximum(draws - best, 0).mean(0)
    np.testing.assert_allclose(expected_improvement(mean, sd, best), mc, atol=3e-3)
    assert expected_improvement(mean, sd, best)[3] == pytest.approx(0.1)


def test_bo_with_an_exact_causal_prior_finds_the_maximum_at_once():
    values = np.sin(np.linspace(0, 3, 30))
    base = np.exp(-0.5 * np.subtract.outer(np.arange(30), np.arange(30)) ** 2 / 9.0)
    mean, cov = causal_prior(values, np.full(30, 1e-6), base * 1e-4)
    trace = bayes_opt(values, mean, cov, n_iter=3, start=0)
    assert trace.regret[1] == 0 and trace.regret[0] > 0
    flat = bayes_opt(values, np.zeros(30), base, n_iter=29, start=0)
    assert flat.regret[-1] == 0 and len(set(flat.queries)) == 30


# ------------------------------------------------------------------ bad input


def test_bad_input_raises_clear_errors(chain_fit):
    _, data, fit = chain_fit
    A, V, Y = data.A.numpy(), data.V0.numpy(), data.Y.numpy()
    with pytest.raises(ValueError, match="D0 is mismatched"):
        FusedData(A[:-1], V, V, Y)
    with pytest.raises(ValueError, match="D1 is mismatched"):
        FusedData(A, V, V, Y[:-1])
    with pytest.raises(ValueError, match="same columns"):
        FusedData(A, V, V[:, :1], Y)
    bad = V.copy()
    bad[3, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        FusedData.single(A, bad, Y)
    with pytest.raises(ValueError, match="infinite"):
        FusedData.single(A, V, np.where(np.arange(len(Y)) == 2, np.inf, Y))
    with pytest.raises(TypeError):
        FusedData.single(A.tolist(), V, Y)
    for scale in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="measure scale"):
            fit.posterior.variance(scale)
    with pytest.raises(ValueError, match="measure scales"):
        cal.calibrate_measure_scale(data, fit.outcome, fit.treatment,
                                    Intervention(np.zeros((2, 1))), scales=(1.0, 0.0))
    with pytest.raises(ValueError, match="unknown methods"):
        ex.fit_methods(data, Intervention(np.zeros((2, 1))), methods=("magic",))
    with pytest.raises(ValueError, match="lengthscales"):
        GaussianKernel(torch.tensor([1.0, -1.0]), 1.0)
    with pytest.raises(ValueError, match="noise"):
        GPStage(fit.outcome.kernel, 0.0)
    with pytest.raises(ValueError, match="columns"):
        Intervention(np.zeros((3, 2)), columns=(0,))
    with pytest.raises(ValueError, match="noise"):
        sim.mediator_chain(50, 2, noise=-0.1)


def test_bayes_opt_with_the_true_mean_queries_the_maximum_first():
    from icml26.interventional_gp.cbo import bayes_opt

    grid = np.linspace(-2, 2, 30)
    truth = np.sin(2 * grid) + 0.3 * grid
    cov = np.exp(-0.5 * (grid[:, None] - grid[None, :]) ** 2 / 0.3**2)
    trace = bayes_opt(truth, truth, 1e-6 * cov, n_iter=3, start=0)
    assert trace.queries[1] == int(np.argmax(truth)) and trace.regret[1] == 0
    flat = bayes_opt(truth, np.zeros_like(truth), cov, n_iter=3, start=0)
    assert flat.regret[0] == truth.max() - truth[0]


# ------------------------------------------------------------------ fused data, calibrations


def test_closed_form_variance_matches_spectral_draws_on_fused_data():
    """Unpaired D0 and D1 (K01 != K00): a swap of the two Gram matrices would fail here."""
    rng = np.random.default_rng(21)
    A = rng.uniform(-1, 1, (50, 1))
    V0 = np.column_stack([np.sin(2 * A[:, 0]), A[:, 0] ** 2]) + 0.2 * rng.standard_normal((50, 2))
    V1 = rng.standard_normal((40, 2)) * 0.8
    Y = np.sin(V1).sum(1) + 0.1 * rng.standard_normal(40)
    data = FusedData(A, V0, V1, Y)
    assert not data.paired
    outcome = GPStage(GaussianKernel(torch.tensor([0.8, 1.0]), 1.2), 0.05)
    treatment = GPStage(GaussianKernel(torch.tensor([0.5]), 0.9), 0.05)
    intervention = Intervention(np.linspace(-1, 1, 7)[:, None])
    post = ImpspecPosterior(data, outcome, treatment, intervention)
    basis = nystrom_basis(outcome.kernel, post.measure(1.0), 1500, 300, seed=3)
    draws = spectral_draws(data, outcome, treatment, intervention, basis, 20_000, seed=4)
    ratio = draws.var(0) / post.variance(1.0)
    assert (ratio - 1).abs().max() < 0.05, ratio
    assert (draws.mean(0) - post.mean).abs().max() < 0.03


def test_bayesimp_calibration_uses_the_same_bootstrap_and_grid():
    chain = sim.mediator_chain(40, 2, 0.5, seed=1, grid_size=6)
    data, intervention = chain.observed(), chain.intervention()
    fit = ex.fit_impspec(data, intervention, max_iter=20)
    (outcome, treatment), _ = ex.fit_bayesimp(data, intervention, max_iter=20)
    result = cal.calibrate_bayesimp_scale(data, outcome, treatment, intervention,
                                          scales=(0.5, 1.0, 4.0), n_boot=3, seed=2)
    assert result.scale in (0.5, 1.0, 4.0)
    assert result.coverage.shape == (3, 6, len(cal.LEVELS))
    assert np.isclose(result.losses.min(), result.losses[result.scales.index(result.scale)])
    # level 1 is the whole line, always covered; losses are means of absolute gaps
    assert (result.coverage[:, :, -1] == 1).all() and (result.losses >= 0).all()
    with pytest.raises(ValueError, match="n_boot"):
        cal.calibrate_bayesimp_scale(data, outcome, treatment, intervention, n_boot=0)
    with pytest.raises(ValueError, match="scales"):
        cal.calibrate_bayesimp_scale(data, outcome, treatment, intervention, scales=(0.0,))
    impspec = cal.calibrate_measure_scale(data, fit.outcome, fit.treatment, intervention,
                                          scales=(0.5, 1.0, 4.0), n_boot=3, seed=2)
    assert impspec.coverage.shape == result.coverage.shape


def test_valid_choice_drops_scales_below_the_validity_bound():
    losses = np.array([0.01, 0.05, 0.2, 0.03, 0.4])
    result = cal.CalibrationResult(2.0**-4, cal.SCALES, losses, np.zeros((5, 1, 1)))
    assert cal.valid_choice(result) == 4.0
    assert cal.valid_choice(result, lower=0.01) == 2.0**-4
    with pytest.raises(ValueError, match="no scale"):
        cal.valid_choice(result, lower=100.0)


def test_unconfounded_backdoor_control_has_no_covariate_effect():
    confounded = sim.diabetes_backdoor(3, 10, n=80)
    control = sim.diabetes_backdoor(3, 10, n=80, confounded=False)
    # without the link, the treatment and the truth ignore W entirely
    assert abs(np.corrcoef(control.A, control.W[:, 1])[0, 1]) < 0.3
    assert abs(np.corrcoef(confounded.A, confounded.W[:, 1])[0, 1]) > 0.5
    shuffled = sim.backdoor_effect(control.grid, control.W[::-1] * 2.0, control.link)
    np.testing.assert_allclose(control.truth(), shuffled, rtol=0, atol=1e-12)
    assert not np.allclose(confounded.truth(),
                           sim.backdoor_effect(confounded.grid, confounded.W * 2.0))
    with pytest.raises(TypeError, match="confounded"):
        sim.diabetes_backdoor(3, 10, n=80, confounded=1)


def test_fit_methods_runs_the_matched_calibrations():
    chain = sim.mediator_chain(40, 2, 0.5, seed=2, grid_size=5)
    fit = ex.fit_methods(chain.observed(), chain.intervention(), max_iter=20, n_boot=2,
                         scales=(0.25, 1.0, 4.0), methods=("impspec_cal_valid", "bayesimp_cal"))
    assert {"impspec", "impspec_cal", "impspec_cal_valid", "bayesimp_cal"} <= set(fit.estimates)
    valid = cal.valid_choice(fit.calibration)
    assert valid in (1.0, 4.0)
    np.testing.assert_allclose(fit.estimates["impspec_cal_valid"].sd ** 2,
                               fit.posterior.variance(valid).numpy(), rtol=1e-12)


@pytest.mark.parametrize("paired", [True, False])
def test_batched_bootstrap_calibration_matches_the_loop(paired):
    chain = sim.mediator_chain(40, 2, 0.5, seed=4, grid_size=8)
    data, intervention = chain.observed(), chain.intervention()
    if not paired:
        other = sim.mediator_chain(30, 2, 0.5, seed=5).observed()
        data = FusedData(data.A, data.V0, other.V1, other.Y)
    fit = ex.fit_impspec(data, intervention, 15)
    batched = cal.calibrate_measure_scale(data, fit.outcome, fit.treatment, intervention,
                                          n_boot=5, seed=1)
    # naming the (only) column of A sends the same problem through the per-bootstrap loop
    looped = cal.calibrate_measure_scale(data, fit.outcome, fit.treatment,
                                         Intervention(intervention.values, columns=(0,)),
                                         n_boot=5, seed=1)
    assert batched.scale == looped.scale
    np.testing.assert_allclose(batched.losses, looped.losses, atol=1e-12)
    np.testing.assert_allclose(batched.coverage, looped.coverage, atol=1e-12)


def test_bias_share_separates_a_constant_offset_from_noise():
    rng = np.random.default_rng(0)
    truth = np.sin(np.linspace(0, 3, 30))
    results = [ex.SeedResult(seed, {}, 1.0, {}, {}, means={"impspec": truth + 0.3
                                                         + 0.3 * rng.standard_normal(30)},
                             truth=truth) for seed in range(400)]
    # bias^2 = 0.09 and variance 0.09: half the squared error is bias
    assert ex.bias_share(results) == pytest.approx(0.5, abs=0.03)
    with pytest.raises(ValueError, match="two data sets"):
        ex.bias_share(results[:1])


def test_backdoor_rmse_shares_the_outcome_stage_and_matches_separate_fits():
    problem = sim.diabetes_backdoor(4, 8, n=60)
    shared = ex.backdoor_rmse(problem, max_iter=15)
    truth = problem.truth()
    for label, adjust in (("adjusted", True), ("unadjusted", False)):
        fit = ex.fit_impspec(problem.observed(adjust=adjust), problem.intervention(adjust=adjust),
                             max_iter=15)
        separate = np.sqrt(np.mean((fit.posterior.mean.numpy() - truth) ** 2))
        assert shared[label] == pytest.approx(separate, rel=1e-9)
