"""Active inference for U-statistics: the ``active-ustatistics`` chapter's implementation.

* :mod:`.estimators`: kernels, the AIPW U-statistic (atom form), classical baselines, exact
  reference values;
* :mod:`.sampling`: uniform, water-filling and practical sampling rules, Poisson sampling;
* :mod:`.ranking`: the U-statistic ERM extension (pairwise logistic ranking, sandwich interval);
* :mod:`.simulation`: synthetic and pool worlds, designs, Monte Carlo studies.
"""

from .estimators import (
    UStatEstimate,
    aipw_ustatistic,
    as_records,
    classical_ustatistic,
    full_ustatistic,
    gini_kernel,
    gini_mean_difference,
    kendall_kernel,
    kendall_records,
    kendall_tau_a,
    mean_kernel,
    prediction_row_sums,
)
from .ranking import RankingFit, aipw_sign_matrix, fit_pairwise_ranking
from .sampling import (
    check_budget,
    mix_with_uniform,
    plugin_projection,
    poisson_sample,
    practical_inclusion,
    uniform_inclusion,
    water_filling,
)
from .simulation import (
    GINI,
    SortedProjection,
    StudyResult,
    SyntheticDesign,
    Target,
    World,
    active_design,
    fit_regressor,
    fit_uncertainty,
    kendall_target,
    oracle_design,
    run_study,
    standard_designs,
    synthetic_worlds,
    uniform_design,
)

__all__ = [
    "GINI", "RankingFit", "SortedProjection", "StudyResult", "SyntheticDesign", "Target",
    "UStatEstimate", "World", "active_design", "aipw_sign_matrix", "aipw_ustatistic",
    "as_records", "check_budget", "classical_ustatistic", "fit_pairwise_ranking",
    "fit_regressor", "fit_uncertainty", "full_ustatistic", "gini_kernel", "gini_mean_difference",
    "kendall_kernel", "kendall_records", "kendall_tau_a", "kendall_target", "mean_kernel",
    "mix_with_uniform", "oracle_design", "plugin_projection", "poisson_sample",
    "practical_inclusion", "prediction_row_sums", "run_study", "standard_designs",
    "synthetic_worlds", "uniform_design", "uniform_inclusion", "water_filling",
]
