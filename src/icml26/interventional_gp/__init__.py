"""Interventional processes (IMPspec): the ``interventional-gp`` chapter's implementation.

* :mod:`.kernels`: ARD Gaussian kernels, Gaussian measures, the closed-form integral operator
  matrix $R$ and longer kernel chains;
* :mod:`.posterior`: fused data, the IMPspec posterior (three variance terms), exact BayesIMP and
  BayesIMP with the variance formula of the authors' baseline;
* :mod:`.training`: the $Y \\mid V$ stage in gpytorch and the $V \\mid A$ objective;
* :mod:`.calibration`: coverage, calibration score, bootstrap calibration of the measure;
* :mod:`.spectral`: a Nyström basis of $k_V$ in $L^2(\\nu)$ and Monte Carlo draws of $\\theta$;
* :mod:`.baselines`: the sampling-GP baseline; :mod:`.cbo`: expected improvement and causal BO;
* :mod:`.simulators`: the mediator chain and the diabetes back-door problem;
* :mod:`.drawing`: the chapter's settings as causal graphs (DAGs);
* :mod:`.experiments`: fitting all methods, evaluation, seed studies.
"""

from .baselines import fit_sampling_stage, sampling_gp_inner_sweep, sampling_gp_moments
from .calibration import (
    LEVELS,
    SCALES,
    VALID_SCALE,
    CalibrationResult,
    calibrate_bayesimp_scale,
    calibrate_measure_scale,
    calibration_score,
    coverage_curve,
    interval_hits,
    valid_choice,
)
from .cbo import BOTrace, bayes_opt, causal_prior, expected_improvement, gp_posterior_on_grid
from .drawing import BACKDOOR_GRAPH, BENCHMARK_CHAIN, MEDIATOR_CHAIN
from .experiments import (
    LABELS,
    METHODS,
    Estimate,
    Fit,
    Metrics,
    SeedResult,
    StudySummary,
    backdoor_rmse,
    bias_share,
    evaluate,
    fit_bayesimp,
    fit_impspec,
    fit_methods,
    misplaced_target,
    run_mediator_seed,
    run_study,
    summarise,
)
from .kernels import (
    GaussianKernel,
    GaussianMeasure,
    data_measure,
    integral_operator_gram,
    kernel_chain_gram,
    kernel_chain_trace,
    median_lengthscales,
    stable_cholesky,
)
from .posterior import (
    FusedData,
    GPStage,
    ImpspecPosterior,
    Intervention,
    Moments,
    VarianceTerms,
    bayesimp_code_moments,
    bayesimp_moments,
    outcome_posterior,
    treatment_weights,
)
from .simulators import (
    BACKDOOR,
    DiabetesBackdoor,
    MediatorChain,
    backdoor_effect,
    chain_effect,
    diabetes_backdoor,
    mediator_chain,
)
from .spectral import SpectralBasis, gaussian_mercer_eigenvalues, nystrom_basis, spectral_draws
from .training import (
    fit_bayesimp_outcome,
    fit_outcome_stage,
    fit_treatment_stage,
    outcome_gpytorch_model,
    treatment_objective,
)

__all__ = [
    "backdoor_rmse", "bias_share", "misplaced_target",
    "BACKDOOR", "BACKDOOR_GRAPH", "BENCHMARK_CHAIN", "BOTrace", "CalibrationResult",
    "DiabetesBackdoor", "Estimate", "Fit", "FusedData", "GPStage", "GaussianKernel",
    "GaussianMeasure", "ImpspecPosterior", "Intervention", "LABELS", "LEVELS", "MEDIATOR_CHAIN",
    "METHODS", "MediatorChain", "Metrics", "Moments", "SCALES", "SeedResult", "SpectralBasis",
    "StudySummary", "VALID_SCALE", "VarianceTerms", "backdoor_effect", "bayes_opt",
    "bayesimp_code_moments", "bayesimp_moments", "calibrate_bayesimp_scale",
    "calibrate_measure_scale", "calibration_score", "causal_prior",
    "chain_effect", "coverage_curve", "data_measure", "diabetes_backdoor", "evaluate",
    "expected_improvement", "fit_bayesimp", "fit_bayesimp_outcome", "fit_impspec", "fit_methods",
    "fit_outcome_stage", "fit_sampling_stage", "fit_treatment_stage",
    "gaussian_mercer_eigenvalues", "gp_posterior_on_grid", "integral_operator_gram",
    "interval_hits", "kernel_chain_gram", "kernel_chain_trace", "median_lengthscales",
    "mediator_chain", "nystrom_basis", "outcome_gpytorch_model", "outcome_posterior",
    "run_mediator_seed", "run_study", "sampling_gp_inner_sweep", "sampling_gp_moments",
    "spectral_draws", "stable_cholesky", "summarise", "treatment_objective", "treatment_weights",
    "valid_choice",
]
