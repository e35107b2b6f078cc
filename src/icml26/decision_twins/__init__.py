"""DT²: decision-targeted digital twins (chapter ``decision-twins``).

:mod:`~icml26.decision_twins.env` holds gymnasium's ``Pendulum-v1`` in torch, the controllers and
the offline data; :mod:`~icml26.decision_twins.ope` fitted Q-evaluation on random Fourier
features; :mod:`~icml26.decision_twins.twins` the batched twins, rollout values, the DT² loss,
decision metrics and the analytic counterexample; :mod:`~icml26.decision_twins.experiment` the
replicated pendulum study.
"""

from icml26.decision_twins.env import (
    DT,
    GAIN_HIGH,
    GAIN_LOW,
    MAX_SPEED,
    MAX_TORQUE,
    OfflineData,
    actuator,
    angle_normalize,
    check_cubic,
    check_gains,
    check_offline,
    collect_offline,
    pendulum_reward,
    pendulum_step,
    policy_torque,
    reset_states,
    sample_gains,
    true_values,
)
from icml26.decision_twins.experiment import (
    Config,
    Replicate,
    Study,
    Variant,
    evaluate,
    make_replicate,
    replicate_seeds,
    run_study,
    train_variants,
)
from icml26.decision_twins.ope import FourierFeatures, fitted_q_evaluation
from icml26.decision_twins.twins import (
    BatchedTwin,
    Counterexample,
    LinearTwin,
    MLPTwin,
    TrainingLog,
    check_weights,
    decision_regret,
    kendall_tau,
    one_step_loss,
    pair_temperature,
    pairwise_accuracy,
    ranking_loss,
    train_dt2,
    twin_values,
)

__all__ = [
    "DT", "GAIN_HIGH", "GAIN_LOW", "MAX_SPEED", "MAX_TORQUE", "BatchedTwin", "Config",
    "Counterexample", "FourierFeatures", "LinearTwin", "MLPTwin", "OfflineData", "Replicate",
    "Study", "TrainingLog", "Variant", "actuator", "angle_normalize", "check_cubic",
    "check_gains", "check_offline",
    "check_weights", "collect_offline", "decision_regret", "evaluate", "fitted_q_evaluation",
    "kendall_tau", "make_replicate", "one_step_loss", "pair_temperature", "pairwise_accuracy",
    "pendulum_reward", "pendulum_step", "policy_torque", "ranking_loss", "replicate_seeds",
    "reset_states", "run_study", "sample_gains", "train_dt2", "train_variants", "true_values",
    "twin_values",
]
