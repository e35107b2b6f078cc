"""Dr. Kernel: unbiased multi-turn policy gradients and reward hacking (chapter ``dr-kernel``).

:mod:`~icml26.dr_kernel.estimators` holds the turn-level advantages (GRPO, TRLOO), the
refinement toy with its analytic gradient, the shared-parameter toy and mismatch rejection;
:mod:`~icml26.dr_kernel.bandit` the strategy policy with the hacking check, PR and PRS;
:mod:`~icml26.dr_kernel.gym` the CPU mini gym that runs real candidate implementations, and
sequential test-time scaling on it.
"""

from icml26.dr_kernel.bandit import (
    CONFIGS,
    STRATEGIES,
    ArmStatistics,
    Outcomes,
    PolicyRun,
    RewardConfig,
    arm_statistics,
    baseline_mean,
    expected_update,
    kernel_reward,
    mean_field_policy,
    policy_gradient,
    prs_keep,
    prs_keep_probability,
    success_mixture,
    synthetic_outcomes,
    train_policies,
    train_policy,
)
from icml26.dr_kernel.estimators import (
    ESTIMATORS,
    REWARD_MEAN,
    SHARED_METHODS,
    BiasEstimate,
    RefinementProcess,
    Rollouts,
    SharedParameterToy,
    SharedRun,
    gradient_estimates,
    gradient_ratio,
    group_advantages,
    mismatch_keep,
    returns_to_go,
    train_refinement,
    train_shared,
)
from icml26.dr_kernel.gym import (
    TASKS,
    Candidate,
    CostModel,
    Evaluation,
    GymTable,
    OpLogger,
    Task,
    TestTimeScaling,
    build_table,
    evaluate,
    make_candidates,
    sequential_scaling,
    wall_time,
)

__all__ = [
    "CONFIGS", "ESTIMATORS", "REWARD_MEAN", "SHARED_METHODS", "STRATEGIES", "TASKS",
    "ArmStatistics", "BiasEstimate", "Candidate", "CostModel", "Evaluation", "GymTable",
    "OpLogger", "Outcomes", "PolicyRun", "RefinementProcess", "RewardConfig", "Rollouts",
    "SharedParameterToy", "SharedRun", "Task", "TestTimeScaling", "arm_statistics",
    "baseline_mean", "build_table", "evaluate", "expected_update", "gradient_estimates",
    "gradient_ratio", "group_advantages", "kernel_reward", "make_candidates",
    "mean_field_policy", "mismatch_keep", "policy_gradient", "prs_keep", "prs_keep_probability",
    "returns_to_go", "sequential_scaling", "success_mixture", "synthetic_outcomes",
    "train_policies", "train_policy", "train_refinement", "train_shared", "wall_time",
]
