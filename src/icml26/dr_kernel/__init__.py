"""Dr. Kernel: unbiased multi-turn policy gradients and reward hacking (chapter ``dr-kernel``).

:mod:`~icml26.dr_kernel.estimators` holds the turn-level advantages (GRPO, TRLOO), the
refinement toy with its analytic gradient and mismatch rejection;
:mod:`~icml26.dr_kernel.bandit` the strategy policy with the hacking check, PR and PRS;
:mod:`~icml26.dr_kernel.gym` the CPU mini gym that runs real candidate implementations.
"""

from icml26.dr_kernel.bandit import (
    CONFIGS,
    STRATEGIES,
    ArmStatistics,
    Outcomes,
    PolicyRun,
    RewardConfig,
    arm_statistics,
    expected_update,
    kernel_reward,
    policy_gradient,
    prs_keep,
    prs_keep_probability,
    synthetic_outcomes,
    train_policies,
    train_policy,
)
from icml26.dr_kernel.estimators import (
    ESTIMATORS,
    REWARD_MEAN,
    BiasEstimate,
    RefinementProcess,
    Rollouts,
    gradient_estimates,
    gradient_ratio,
    group_advantages,
    mismatch_keep,
    returns_to_go,
    train_refinement,
)
from icml26.dr_kernel.gym import (
    TASKS,
    Candidate,
    CostModel,
    Evaluation,
    GymTable,
    OpLogger,
    Task,
    build_table,
    evaluate,
    make_candidates,
    wall_time,
)

__all__ = [
    "CONFIGS", "ESTIMATORS", "REWARD_MEAN", "STRATEGIES", "TASKS", "ArmStatistics", "BiasEstimate",
    "Candidate", "CostModel", "Evaluation", "GymTable", "OpLogger", "Outcomes", "PolicyRun",
    "RefinementProcess", "RewardConfig", "Rollouts", "Task", "arm_statistics", "build_table",
    "evaluate", "expected_update", "gradient_estimates", "gradient_ratio", "group_advantages",
    "kernel_reward", "make_candidates", "mismatch_keep", "policy_gradient", "prs_keep",
    "prs_keep_probability", "returns_to_go", "synthetic_outcomes", "train_policies",
    "train_policy", "train_refinement", "wall_time",
]
