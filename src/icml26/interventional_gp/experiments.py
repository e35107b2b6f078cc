"""Fitting every method on one data set, evaluating against the truth, and the seed studies.

:func:`fit_methods` sees only observed data; :func:`evaluate` is the one place where the ground
truth enters, after all fitting and calibration is done.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from icml26.core import Timer

from ..core import one_thread
from .baselines import fit_sampling_stage, sampling_gp_inner_sweep
from .calibration import (
    LEVELS,
    SCALES,
    CalibrationResult,
    calibrate_bayesimp_scale,
    calibrate_measure_scale,
    calibration_score,
    coverage_curve,
    valid_choice,
)
from .cbo import BOTrace, bayes_opt, causal_prior
from .kernels import GaussianKernel, data_measure
from .posterior import (
    FusedData,
    GPStage,
    ImpspecPosterior,
    Intervention,
    bayesimp_code_moments,
    bayesimp_moments,
)
from .simulators import DiabetesBackdoor, mediator_chain
from .training import fit_bayesimp_outcome, fit_outcome_stage, fit_treatment_stage

METHODS = ("impspec_cal", "impspec_cal_valid", "impspec", "bayesimp", "bayesimp_alpha_r",
           "bayesimp_cal", "bayesimp_exact", "sampling_gp")
BAYESIMP_METHODS = {"bayesimp", "bayesimp_alpha_r", "bayesimp_cal", "bayesimp_exact"}
LABELS = {"impspec_cal": "IMPspec + calibration",
          "impspec_cal_valid": "IMPspec + calibration (valid grid)",
          "impspec": "IMPspec ($\\nu_s = 1$)",
          "bayesimp": "BayesIMP (superseded formula, ff40a32)",
          "bayesimp_alpha_r": "BayesIMP (authors' current formula)",
          "bayesimp_cal": "BayesIMP (current formula) + calibration",
          "bayesimp_exact": "BayesIMP (all exact)",
          "sampling_gp": "sampling GP"}


@dataclass(frozen=True)
class Estimate:
    """Posterior mean and sd of $\\theta$ on the intervention grid."""

    mean: np.ndarray
    sd: np.ndarray


@dataclass
class Fit:
    """Everything learned from one data set, and the wall-clock seconds of each stage."""

    outcome: GPStage
    treatment: GPStage
    posterior: ImpspecPosterior
    calibration: CalibrationResult | None = None
    bayesimp: tuple[GPStage, GPStage] | None = None
    estimates: dict[str, Estimate] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    inner: dict[int, Estimate] = field(default_factory=dict)
    within: np.ndarray | None = None


def _estimate(mean, variance) -> Estimate:
    return Estimate(np.asarray(mean, float), np.sqrt(np.clip(np.asarray(variance, float), 0, None)))


def fit_impspec(data: FusedData, intervention: Intervention, max_iter: int) -> Fit:
    """Both IMPspec stages (``eq-igp-ml-y``, ``eq-igp-ml-a``) and the posterior on the grid (no
    calibration)."""
    with one_thread():
        return _fit_impspec(data, intervention, max_iter)


def _fit_impspec(data: FusedData, intervention: Intervention, max_iter: int) -> Fit:
    with Timer() as t_outcome:
        outcome = fit_outcome_stage(data.V1, data.Y, max_iter)
    with Timer() as t_treatment:
        K00 = outcome.kernel.gram(data.V0)
        treatment = fit_treatment_stage(data.A, K00, outcome.kernel.outputscale, max_iter)
    posterior = ImpspecPosterior(data, outcome, treatment, intervention)
    seconds = {"outcome stage": t_outcome.seconds, "treatment stage": t_treatment.seconds}
    return Fit(outcome, treatment, posterior, seconds=seconds)


def fit_bayesimp(data: FusedData, intervention: Intervention, max_iter: int):
    """BayesIMP ($\\nu_s = 1$): marginal likelihood under $r$, ``eq-igp-ml-a`` with its own $k_V$.

    Returns the two stages and the moments of three variance formulas: the authors' (weights
    under $k$, approximate $S$), the authors' $S$ with the weights under $r$, and all exact.
    """
    outcome = fit_bayesimp_outcome(data.V1, data.Y, max_iter)
    K00 = outcome.kernel.gram(data.V0)
    treatment = fit_treatment_stage(data.A, K00, outcome.kernel.outputscale, max_iter)
    measure = data_measure(data.V1, 1.0)
    exact = bayesimp_moments(data, outcome, treatment, intervention, measure)
    moments = {
        "bayesimp": bayesimp_code_moments(data, outcome, treatment, intervention, measure,
                                          exact=exact),
        "bayesimp_alpha_r": bayesimp_code_moments(data, outcome, treatment, intervention,
                                                  measure, weights="nuclear", exact=exact),
        "bayesimp_exact": exact}
    return (outcome, treatment), moments


def fit_methods(data: FusedData, intervention: Intervention, max_iter: int = 100,
                scales=SCALES, n_boot: int = 20, n_draws: int = 50, n_inner: int = 10,
                seed: int = 0, methods=METHODS, inner_sweep=()) -> Fit:
    """Fit the requested methods on observed data only; return their estimates on the grid.

    The sampling GP uses ``n_inner`` inner draws $M$; every $M$ in ``inner_sweep`` is run too,
    from the same draws (``Fit.inner``, with the within-draw variance in ``Fit.within``).
    """
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown methods {sorted(unknown)}; choose from {METHODS}")
    with one_thread():
        return _fit_methods(data, intervention, max_iter, scales, n_boot, n_draws, n_inner, seed,
                            methods, inner_sweep)


def _fit_methods(data, intervention, max_iter, scales, n_boot, n_draws, n_inner, seed, methods,
                 inner_sweep) -> Fit:
    fit = fit_impspec(data, intervention, max_iter)
    post = fit.posterior
    fit.estimates["impspec"] = _estimate(post.mean, post.variance(1.0))
    if {"impspec_cal", "impspec_cal_valid"} & set(methods):
        with Timer() as timer:
            fit.calibration = calibrate_measure_scale(data, fit.outcome, fit.treatment,
                                                      intervention, scales, n_boot, seed=seed)
        fit.seconds["calibration"] = timer.seconds
        fit.estimates["impspec_cal"] = _estimate(post.mean, post.variance(fit.calibration.scale))
        if "impspec_cal_valid" in methods:
            fit.estimates["impspec_cal_valid"] = _estimate(
                post.mean, post.variance(valid_choice(fit.calibration)))
    if BAYESIMP_METHODS & set(methods):
        with Timer() as timer:
            fit.bayesimp, moments = fit_bayesimp(data, intervention, max_iter)
        fit.seconds["BayesIMP"] = timer.seconds
        for name in BAYESIMP_METHODS & set(methods) - {"bayesimp_cal"}:
            fit.estimates[name] = _estimate(moments[name].mean, moments[name].variance)
        if "bayesimp_cal" in methods:
            # the same bootstrap rows (same seed) and grid as IMPspec's calibration
            result = calibrate_bayesimp_scale(data, *fit.bayesimp, intervention, scales, n_boot,
                                              seed=seed)
            chosen = bayesimp_code_moments(data, *fit.bayesimp, intervention,
                                           data_measure(data.V1, result.scale),
                                           weights="nuclear")
            fit.estimates["bayesimp_cal"] = _estimate(chosen.mean, chosen.variance)
    if "sampling_gp" in methods:
        with Timer() as timer:
            stage = fit_sampling_stage(data, max_iter)
            inner = tuple(sorted({n_inner, *inner_sweep}))
            moments = sampling_gp_inner_sweep(data, fit.outcome, stage, intervention, n_draws,
                                              inner, seed, within=max(inner) > 1)
        fit.seconds["sampling GP"] = timer.seconds
        fit.estimates["sampling_gp"] = _estimate(*moments[n_inner])
        fit.inner = {m: _estimate(*moments[m]) for m in inner}
        if "within" in moments:
            fit.within = moments["within"].numpy()
    fit.estimates = {name: fit.estimates[name] for name in METHODS if name in fit.estimates}
    return fit


def backdoor_rmse(problem: DiabetesBackdoor, max_iter: int = 100) -> dict[str, float]:
    """RMSE of IMPspec's posterior mean on one back-door problem, adjusted for $W$ and not.

    The $Y \\mid V$ stage sees the same $(V, Y)$ in both analyses, so it is fitted once and
    shared; only the $V$-stage differs (inputs $(A, W)$ or $A$ alone). The result equals two
    calls of :func:`fit_impspec` (L-BFGS is deterministic), at one outcome fit less. The RMSE
    needs the posterior mean only, which does not depend on the measure scale.
    """
    with one_thread():
        data = problem.observed()
        outcome = fit_outcome_stage(data.V1, data.Y, max_iter)
        truth = problem.truth()
        rmse = {}
        for label, adjust in (("adjusted", True), ("unadjusted", False)):
            data = problem.observed(adjust=adjust)
            treatment = fit_treatment_stage(data.A, outcome.kernel.gram(data.V0),
                                            outcome.kernel.outputscale, max_iter)
            post = ImpspecPosterior(data, outcome, treatment, problem.intervention(adjust=adjust))
            rmse[label] = float(np.sqrt(np.mean((post.mean.numpy() - truth) ** 2)))
    return rmse


@dataclass(frozen=True)
class Metrics:
    """RMSE, coverage of the truth at each level, and the calibration score."""

    rmse: float
    coverage: np.ndarray
    score: float


def evaluate(estimates: dict[str, Estimate], truth, levels=LEVELS) -> dict[str, Metrics]:
    """Score each estimate against the true interventional function (latent variances)."""
    truth = np.asarray(truth, float)
    metrics = {}
    for name, est in estimates.items():
        coverage = coverage_curve(truth, est.mean, est.sd, levels)
        rmse = float(np.sqrt(np.mean((est.mean - truth) ** 2)))
        metrics[name] = Metrics(rmse, coverage, calibration_score(coverage, levels))
    return metrics


@dataclass(frozen=True)
class SeedResult:
    """One seed of the mediator-chain study."""

    seed: int
    metrics: dict[str, Metrics]
    scale: float
    bo: dict[str, BOTrace]
    seconds: dict[str, float]
    inner: dict[int, Metrics] = field(default_factory=dict)
    inner_variance: dict[int, float] = field(default_factory=dict)
    within: float = float("nan")
    mean_variance: dict[str, float] = field(default_factory=dict)
    boot_losses: dict[float, float] = field(default_factory=dict)
    y_variance: float = float("nan")  # Var(Y), the output scale of the BO's base kernel
    means: dict[str, np.ndarray] = field(default_factory=dict)  # posterior means on the grid
    truth: np.ndarray | None = None


def misplaced_target(truth, prior_mean, grid, width: float = 0.1) -> np.ndarray:
    r"""The BO target with its maximum put where the prior mean is lowest.

    Adds to $\theta$ a Gaussian bump of sd ``width`` times the grid's range, centred at
    $\arg\min m$, tall enough that the new maximum exceeds the old one by half the range of
    $\theta$: the best intervention lies where the observational estimate $m$ points least (an
    effect that the observational data cannot show, e.g. a pathway that only the intervention
    opens), so a search that trusts $m$ is misled.
    """
    truth, prior_mean = np.asarray(truth, float), np.asarray(prior_mean, float)
    grid = np.asarray(grid, float).reshape(len(truth), -1)
    centre_index = int(np.argmin(prior_mean))
    spread = width * (grid.max(0) - grid.min(0)).max()
    bump = np.exp(-0.5 * np.sum((grid - grid[centre_index]) ** 2, axis=1) / spread**2)
    height = truth.max() - truth[centre_index] + 0.5 * (truth.max() - truth.min())
    return truth + height * bump


def run_cbo(fit: Fit, truth, grid, n_iter: int, start: int) -> dict[str, BOTrace]:
    """EI with the causal prior (calibrated IMPspec) against a zero-mean GP, same base kernel.

    ``"mean_only"`` is the ablation that keeps the causal prior's mean and drops its
    uncertainty term (covariance $k$ alone), so that a gain can be split between the two. The
    keys ending in ``"_misplaced"`` run the same three priors on :func:`misplaced_target`.
    """
    base = GaussianKernel(fit.treatment.kernel.lengthscale, float(fit.posterior.data.Y.var()))
    base_cov = base.gram(grid).numpy()
    est = fit.estimates.get("impspec_cal", fit.estimates["impspec"])
    mean, cov = causal_prior(est.mean, est.sd**2, base_cov)
    traces = {}
    for suffix, target in (("", truth), ("_misplaced", misplaced_target(truth, mean, grid))):
        traces["causal" + suffix] = bayes_opt(target, mean, cov, n_iter, start)
        traces["mean_only" + suffix] = bayes_opt(target, mean, base_cov, n_iter, start)
        traces["zero_mean" + suffix] = bayes_opt(target, np.zeros_like(mean), base_cov, n_iter,
                                                 start)
    return traces


def run_mediator_seed(seed: int, n: int = 100, d: int = 5, noise: float = 0.5,
                      grid_size: int = 50, bo_iter: int = 10, **fit_options) -> SeedResult:
    """Simulate, fit every method, then evaluate and run causal BO against the truth
    (``bo_iter=0`` skips the BO)."""
    chain = mediator_chain(n, d, noise, seed, grid_size)
    fit = fit_methods(chain.observed(), chain.intervention(), seed=seed, **fit_options)
    truth = chain.truth()
    start = int(np.random.default_rng(seed).integers(grid_size))
    bo, seconds = {}, dict(fit.seconds)
    if bo_iter > 0:
        with Timer() as timer:
            bo = run_cbo(fit, truth, chain.grid, bo_iter, start)
        seconds["causal BO"] = timer.seconds
    scale = fit.calibration.scale if fit.calibration else 1.0
    inner_variance = {m: float(np.mean(est.sd**2)) for m, est in fit.inner.items()}
    within = float(np.mean(fit.within)) if fit.within is not None else float("nan")
    mean_variance = {name: float(np.mean(est.sd**2)) for name, est in fit.estimates.items()}
    boot_losses = (dict(zip(fit.calibration.scales, map(float, fit.calibration.losses),
                            strict=True)) if fit.calibration else {})
    return SeedResult(seed, evaluate(fit.estimates, truth), scale, bo, seconds,
                      evaluate(fit.inner, truth), inner_variance, within, mean_variance,
                      boot_losses, float(fit.posterior.data.Y.var()),
                      {name: est.mean for name, est in fit.estimates.items()},
                      np.asarray(truth, float))


@dataclass(frozen=True)
class StudySummary:
    """Averages over the seeds of a mediator-chain study."""

    rmse: dict[str, float]
    score: dict[str, float]
    score_se: dict[str, float]
    coverage: dict[str, np.ndarray]
    coverage_se: dict[str, np.ndarray]
    regret: dict[str, np.ndarray]
    scales: list[float]
    seconds: dict[str, float]

    def bo_regret(self, name: str) -> float:
        """Simple regret averaged over the queries after the first (``eq-igp-regret``)."""
        return float(self.regret[name][1:].mean())


def bias_share(results: list[SeedResult], name: str = "impspec") -> float:
    r"""Estimated share of the mean squared error of ``name``'s mean that is bias.

    Every data set of a study estimates the same $\theta$, so the bias at $a$ is estimated by the
    mean error over data sets; the share is $\sum_a \text{bias}(a)^2 / \sum_a \text{MSE}(a)$
    (it includes the sampling noise of that mean, about $1/S$ of the variance for $S$ data sets).
    """
    errors = np.array([r.means[name] - r.truth for r in results])
    if len(errors) < 2:
        raise ValueError("the bias share needs at least two data sets")
    return float((errors.mean(0) ** 2).sum() / (errors**2).mean(0).sum())


def run_study(seeds, **options) -> list[SeedResult]:
    """:func:`run_mediator_seed` for every seed."""
    return [run_mediator_seed(int(seed), **options) for seed in seeds]


def summarise(results: list[SeedResult]) -> StudySummary:
    """Mean RMSE, calibration score and coverage curve (each with its standard error over the
    seeds), and regret curves.

    A method, a BO trace or a stage time missing from some seeds (a study whose later seeds fit
    fewer methods) is averaged over the seeds that have it.
    """
    if not results:
        raise ValueError("no seeds to summarise")
    names = list(dict.fromkeys(name for r in results for name in r.metrics))

    def per_seed(name, attr):
        return np.array([getattr(r.metrics[name], attr) for r in results if name in r.metrics])

    def standard_error(values):
        if len(values) < 2:
            return np.full(values.shape[1:], np.nan)
        return values.std(axis=0, ddof=1) / np.sqrt(len(values))

    scores = {name: per_seed(name, "score") for name in names}
    coverages = {name: per_seed(name, "coverage") for name in names}
    return StudySummary(
        rmse={name: float(per_seed(name, "rmse").mean()) for name in names},
        score={name: float(s.mean()) for name, s in scores.items()},
        score_se={name: float(standard_error(s)) for name, s in scores.items()},
        coverage={name: c.mean(axis=0) for name, c in coverages.items()},
        coverage_se={name: standard_error(c) for name, c in coverages.items()},
        regret={kind: np.mean([r.bo[kind].regret for r in results if kind in r.bo], 0)
                for kind in dict.fromkeys(k for r in results for k in r.bo)},
        scales=[r.scale for r in results],
        seconds={stage: float(np.mean([r.seconds[stage] for r in results if stage in r.seconds]))
                 for stage in dict.fromkeys(k for r in results for k in r.seconds)},
    )
