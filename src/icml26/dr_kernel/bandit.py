"""A policy over kernel-writing strategies: reward hacking, lazy optimisation, PR and PRS.

The policy is a softmax over strategies (``lazy``, ``fuse``, ``decoy``). Each rollout draws a
strategy, an environment returns its :class:`Outcomes` (correct? measured and true speed-up,
profiled coverage, caught as a hack?), :func:`kernel_reward` turns them into a reward (Eq.
``eq-drk-reward``, with the profiling-based term of PR), :func:`prs_keep` draws the PRS mask (Eq.
``eq-drk-prs``), and :func:`train_policies` runs REINFORCE with the leave-one-out baseline on
several independent replicates at once (:func:`train_policy` runs one). :func:`arm_statistics`
and :func:`expected_update` give the exact expected update of one step (Eq. ``eq-drk-drift``).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from icml26.dr_kernel.estimators import group_advantages

STRATEGIES = ("lazy", "fuse", "decoy")
"""Strategies of the policy, in the order of its logits."""

CONFIGS = {
    "no check": dict(hack_check=False, profiling_reward=False, rejection=False),
    "check": dict(hack_check=True, profiling_reward=False, rejection=False),
    "check + PR": dict(hack_check=True, profiling_reward=True, rejection=False),
    "check + PRS": dict(hack_check=True, profiling_reward=False, rejection=True),
    "check + PR + PRS": dict(hack_check=True, profiling_reward=True, rejection=True),
}
"""The reward pipelines compared in the chapter."""


@dataclass(frozen=True)
class Outcomes:
    """What the environment reports for a batch of rollouts (one entry per rollout)."""

    correct: np.ndarray  # passes the correctness check
    measured_speedup: np.ndarray  # what the timer reports (a decoy can fool it)
    true_speedup: np.ndarray  # what really ran, against the reference
    coverage: np.ndarray  # share of the profiled cost inside the candidate's own kernels
    hacked: np.ndarray  # the profiling check finds that the declared kernels did not run


@dataclass(frozen=True)
class RewardConfig:
    """One reward pipeline: the hacking check, PR and PRS, with the released constants."""

    hack_check: bool = True
    profiling_reward: bool = False
    rejection: bool = False
    coverage_weight: float = 0.5
    speedup_clip: tuple[float, float] = (0.0, 3.0)
    hack_penalty: float = -1.0
    prs_threshold: float = 0.3
    prs_scale: float = 0.1
    mask_before_baseline: bool = False  # the released order is False: baseline over the group

    def __post_init__(self):
        for name in ("hack_check", "profiling_reward", "rejection", "mask_before_baseline"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool")
        if self.prs_scale <= 0:
            raise ValueError(f"prs_scale must be positive, got {self.prs_scale}")


def kernel_reward(out: Outcomes, config: RewardConfig) -> np.ndarray:
    """Eq. ``eq-drk-reward``: ``1 + clip(s) [+ w kappa]`` if correct, else 0 or a penalty."""
    low, high = config.speedup_clip
    reward = np.where(out.correct, 1.0 + np.clip(out.measured_speedup, low, high), 0.0)
    if config.profiling_reward:
        reward = reward + np.where(out.correct, config.coverage_weight * out.coverage, 0.0)
    if config.hack_check:
        reward = np.where(out.hacked, config.hack_penalty, reward)
    return reward


def prs_keep_probability(out: Outcomes, config: RewardConfig) -> np.ndarray:
    """Eq. ``eq-drk-prs``: ``clip((kappa - tau) / s, 0, 1)`` for correct samples, 1 otherwise.

    A sample the hacking check catches counts as a failure (it earned the penalty), so PRS keeps it.
    """
    if not config.rejection:
        return np.ones(out.correct.shape)
    p = np.clip((out.coverage - config.prs_threshold) / config.prs_scale, 0.0, 1.0)
    judged_correct = out.correct & ~(out.hacked & config.hack_check)
    return np.where(judged_correct, p, 1.0)


def prs_keep(out: Outcomes, config: RewardConfig, rng: np.random.Generator) -> np.ndarray:
    """The PRS mask: a Bernoulli draw per rollout with :func:`prs_keep_probability`."""
    return rng.random(out.correct.shape) < prs_keep_probability(out, config)


def synthetic_outcomes(choice: np.ndarray, rng: np.random.Generator, *,
                       fuse_success: float = 0.45) -> Outcomes:
    """The synthetic environment of the E2 experiment.

    ``lazy``: correct w.p. 0.95, speed-up U[0.98, 1.10], coverage U[0.02, 0.15];
    ``fuse``: correct w.p. ``fuse_success`` (0.45), speed-up U[1.3, 2.6], coverage U[0.7, 0.95];
    ``decoy``: passes the correctness check, fools the timer (measured 3), really runs the
    reference (true speed-up 1), coverage 0, and the profiling check always catches it.
    Bind ``fuse_success`` with :func:`functools.partial` to get another environment.
    """
    if isinstance(fuse_success, bool) or not isinstance(fuse_success, numbers.Real):
        raise TypeError(f"fuse_success must be a probability, got {fuse_success!r}")
    if not 0.0 <= fuse_success <= 1.0:
        raise ValueError(f"fuse_success must lie in [0, 1], got {fuse_success}")
    choice = np.asarray(choice)
    n = choice.shape
    lazy, fuse, decoy = (choice == k for k in range(3))
    u = rng.random(n)
    correct = np.where(lazy, u < 0.95, np.where(fuse, u < fuse_success, True))
    speed = np.where(lazy, rng.uniform(0.98, 1.10, n), rng.uniform(1.3, 2.6, n))
    coverage = np.where(lazy, rng.uniform(0.02, 0.15, n), rng.uniform(0.7, 0.95, n))
    return Outcomes(correct=correct, measured_speedup=np.where(decoy, 3.0, speed),
                    true_speedup=np.where(decoy, 1.0, speed),
                    coverage=np.where(decoy, 0.0, coverage), hacked=decoy)


@dataclass(frozen=True)
class PolicyRun:
    """History of one training run: policy per step and the Fast@1.2 share of each step's group."""

    policy: np.ndarray  # (steps + 1, strategies)
    fast12: np.ndarray  # (steps,) share of rollouts correct, not hacked and truly >= 1.2x
    hacked: np.ndarray  # (steps,) share of rollouts that are hacks

    @property
    def final(self) -> np.ndarray:
        return self.policy[-1]

    def late_fast12(self, fraction: float = 0.2) -> float:
        """Mean Fast@1.2 share over the last ``fraction`` of the steps."""
        k = max(1, int(round(fraction * self.fast12.size)))
        return float(self.fast12[-k:].mean())


def _check_positive_int(value, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


def _softmax(theta: np.ndarray) -> np.ndarray:
    z = np.exp(theta - theta.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def policy_gradient(environment: Callable[[np.ndarray, np.random.Generator], Outcomes],
                    config: RewardConfig, pi, *, group_size: int,
                    rng: np.random.Generator) -> tuple[np.ndarray, Outcomes]:
    """One group per row of ``pi`` (shape ``(R, S)``): the gradient estimate of each group.

    Draw ``group_size`` strategies from each row, get outcomes and rewards, compute leave-one-out
    advantages (Eq. ``eq-drk-trloo`` with one turn) over the whole group, as the released trainer
    does, or over the kept samples only if ``config.mask_before_baseline``, and return
    ``(1/K) sum_i m_i A_i (e_{a_i} - pi)`` (shape ``(R, S)``, its mean is Eq. ``eq-drk-drift``)
    with the outcomes.
    """
    if not isinstance(config, RewardConfig):
        raise TypeError("config must be a RewardConfig")
    group_size = _check_positive_int(group_size, "group size", 2)
    pi = np.asarray(pi, dtype=float)
    if pi.ndim != 2 or pi.shape[1] < 2:
        raise ValueError(f"pi must have shape (groups, strategies >= 2), got {pi.shape}")
    if np.any(pi < 0) or not np.allclose(pi.sum(1), 1.0):
        raise ValueError("every row of pi must be a probability vector")
    groups, strategies = pi.shape
    u = rng.random((groups, group_size, 1))
    choice = np.minimum((u > np.cumsum(pi, -1)[:, None, :]).sum(-1), strategies - 1)
    out = environment(choice, rng)
    if np.shape(out.correct) != choice.shape:
        raise ValueError(f"the environment returned outcomes of shape {np.shape(out.correct)} "
                         f"for choices of shape {choice.shape}")
    reward = kernel_reward(out, config)
    keep = prs_keep(out, config, rng)
    members = keep if config.mask_before_baseline else np.ones(keep.shape, dtype=bool)
    adv = group_advantages(reward, members, "trloo")
    onehot = np.eye(strategies)[choice]
    grad = ((keep * adv)[..., None] * (onehot - pi[:, None, :])).sum(1) / group_size
    return grad, out


def train_policies(environment: Callable[[np.ndarray, np.random.Generator], Outcomes],
                   config: RewardConfig, *, replicates: int, steps: int, group_size: int = 16,
                   lr: float = 0.1, rng: np.random.Generator, strategies: int = 3,
                   ) -> list[PolicyRun]:
    """REINFORCE on softmax logits with the leave-one-out baseline and the PRS mask.

    ``replicates`` independent policies start from uniform and train side by side (one array
    operation per step, one generator); each step is one :func:`policy_gradient` group per
    replicate, ``theta += lr * gradient``.
    """
    replicates = _check_positive_int(replicates, "replicates")
    steps = _check_positive_int(steps, "steps")
    strategies = _check_positive_int(strategies, "strategies", 2)
    theta = np.zeros((replicates, strategies))
    policy = np.empty((steps + 1, replicates, strategies))
    fast = np.empty((steps, replicates))
    hacked = np.empty((steps, replicates))
    for step in range(steps):
        pi = _softmax(theta)
        policy[step] = pi
        grad, out = policy_gradient(environment, config, pi, group_size=group_size, rng=rng)
        theta = theta + lr * grad
        fast[step] = np.mean(out.correct & ~out.hacked & (out.true_speedup >= 1.2), -1)
        hacked[step] = np.mean(out.hacked, -1)
    policy[steps] = _softmax(theta)
    return [PolicyRun(policy[:, r], fast[:, r], hacked[:, r]) for r in range(replicates)]


def train_policy(environment: Callable[[np.ndarray, np.random.Generator], Outcomes],
                 config: RewardConfig, *, steps: int, group_size: int = 16, lr: float = 0.1,
                 rng: np.random.Generator, strategies: int = 3) -> PolicyRun:
    """One run of :func:`train_policies`."""
    return train_policies(environment, config, replicates=1, steps=steps, group_size=group_size,
                          lr=lr, rng=rng, strategies=strategies)[0]


@dataclass(frozen=True)
class ArmStatistics:
    """Per strategy: mean reward ``E[r|k]``, mean kept reward ``E[m r|k]`` and keep rate
    ``E[m|k]`` (Monte Carlo over the environment), with the standard errors of the first two."""

    reward: np.ndarray
    kept_reward: np.ndarray
    keep_rate: np.ndarray
    reward_se: np.ndarray
    kept_reward_se: np.ndarray


def arm_statistics(environment: Callable[[np.ndarray, np.random.Generator], Outcomes],
                   config: RewardConfig, rng: np.random.Generator, *, draws: int = 100_000,
                   strategies: int = 3) -> ArmStatistics:
    """Estimate the ingredients of Eq. ``eq-drk-drift`` from ``draws`` rollouts of each strategy."""
    draws = _check_positive_int(draws, "draws", 2)
    stats = {key: [] for key in ("r", "mr", "m", "r_se", "mr_se")}
    for k in range(_check_positive_int(strategies, "strategies", 2)):
        out = environment(np.full(draws, k), rng)
        reward = kernel_reward(out, config)
        keep = prs_keep_probability(out, config)  # the mask's conditional mean: no extra noise
        for key, values in (("r", reward), ("mr", keep * reward), ("m", keep)):
            stats[key].append(values.mean())
            if key != "m":
                stats[key + "_se"].append(values.std(ddof=1) / np.sqrt(draws))
    return ArmStatistics(*(np.array(stats[k]) for k in ("r", "mr", "m", "r_se", "mr_se")))


def _check_pi(pi, arms: ArmStatistics) -> np.ndarray:
    pi = np.asarray(pi, dtype=float)
    if pi.shape[-1] != np.shape(arms.reward)[-1]:
        raise ValueError(f"pi has {pi.shape[-1]} strategies, the statistics "
                         f"{np.shape(arms.reward)[-1]}")
    if np.any(pi < 0) or not np.allclose(pi.sum(-1), 1.0):
        raise ValueError("pi must be a probability vector")
    return pi


def baseline_mean(pi, arms: ArmStatistics, *, mask_before_baseline: bool = False,
                  group_size: int | None = None) -> np.ndarray:
    """The mean ``beta`` of the leave-one-out baseline ``b_{-i}`` in Eq. ``eq-drk-drift``.

    Released order (the whole group): ``beta = E_pi[r]``. Mask first (Eq. ``eq-drk-beta-first``):
    the other kept rollouts number ``M ~ Binomial(K - 1, eta)`` with ``eta = sum_k pi_k E[m|k]``,
    each with mean reward ``E_pi[m r] / eta``, and the baseline is 0 when ``M = 0``, so
    ``beta = (1 - (1 - eta)^(K - 1)) E_pi[m r] / eta``.
    """
    pi = _check_pi(pi, arms)
    if not mask_before_baseline:
        return (pi * arms.reward).sum(-1)
    if group_size is None:
        raise ValueError("the mask-first baseline needs the group size")
    K = _check_positive_int(group_size, "group size", 2)
    eta = (pi * arms.keep_rate).sum(-1)
    kept = (pi * arms.kept_reward).sum(-1)
    safe = np.where(eta > 0, eta, 1.0)
    return np.where(eta > 0, (1.0 - (1.0 - eta) ** (K - 1)) * kept / safe, 0.0)


def expected_update(pi, arms: ArmStatistics, *, baseline: float | None = None,
                    mask_before_baseline: bool = False, group_size: int | None = None,
                    ) -> np.ndarray:
    """Exact expected REINFORCE step direction ``E[(1/K) sum_i m_i A_i (e_{a_i} - pi)]``.

    Eq. ``eq-drk-drift``: with ``u_k = E[m r|k] - E[m|k] beta``, the component ``k`` is
    ``pi_k (u_k - sum_j pi_j u_j)``. ``beta`` is the mean of the leave-one-out baseline, from
    :func:`baseline_mean` unless given: ``E_pi[r]`` in the released order, Eq.
    ``eq-drk-beta-first`` when the mask is applied before the baseline (then ``group_size`` is
    needed).
    """
    pi = _check_pi(pi, arms)
    if baseline is None:
        beta = baseline_mean(pi, arms, mask_before_baseline=mask_before_baseline,
                             group_size=group_size)
    else:
        beta = baseline
    u = arms.kept_reward - arms.keep_rate * np.asarray(beta)[..., None]
    return pi * (u - (pi * u).sum(-1, keepdims=True))


def success_mixture(success, reward_if_correct, kept_reward_if_correct, keep_if_correct,
                    ) -> ArmStatistics:
    """Arm statistics of strategies that succeed with probability ``success`` (per strategy).

    A success earns ``reward_if_correct`` on average, is kept with probability
    ``keep_if_correct`` and contributes ``kept_reward_if_correct = E[m r | correct]``; a failure
    earns 0 and is always kept (Eq. ``eq-drk-prs``). So ``E[r|k] = psi R``, ``E[m r|k] = psi KR``
    and ``E[m|k] = psi Q + 1 - psi``: the inputs of the phase diagram of Eq. ``eq-drk-drift``.
    """
    arrays = [np.asarray(v, dtype=float) for v in (success, reward_if_correct,
                                                    kept_reward_if_correct, keep_if_correct)]
    psi, reward, kept, keep = np.broadcast_arrays(*arrays)
    if np.any((psi < 0) | (psi > 1)) or np.any((keep < 0) | (keep > 1)):
        raise ValueError("success and keep probabilities must lie in [0, 1]")
    zeros = np.zeros(psi.shape)
    return ArmStatistics(psi * reward, psi * kept, psi * keep + 1 - psi, zeros, zeros)


def mean_field_policy(arms: ArmStatistics, *, steps: int, lr: float,
                      mask_before_baseline: bool = False, group_size: int = 16,
                      start=None) -> np.ndarray:
    """The noise-free path of training: ``theta += lr * E[update](softmax(theta))``.

    Every step moves the logits by the exact expected update of Eq. ``eq-drk-drift`` (with the
    baseline mean of Eq. ``eq-drk-beta-first`` when the mask comes first), so the path
    approximates the average path of :func:`train_policies` when its steps are small (the noise
    of each step is left out, not averaged through the softmax). The fields of ``arms``
    may carry leading axes (a grid of environments, shape ``(..., S)``); ``start`` is the initial
    policy (uniform by default). Returns the policies, shape ``(steps + 1, ..., S)``.
    """
    steps = _check_positive_int(steps, "steps")
    if not lr > 0:
        raise ValueError(f"lr must be positive, got {lr}")
    shape = np.shape(arms.reward)
    if start is None:
        pi = np.full(shape, 1.0 / shape[-1])
    else:
        pi = np.broadcast_to(_check_pi(start, arms), shape).copy()
    theta = np.log(np.maximum(pi, 1e-300))
    path = np.empty((steps + 1, *shape))
    path[0] = pi
    for step in range(steps):
        theta = theta + lr * expected_update(pi, arms, mask_before_baseline=mask_before_baseline,
                                             group_size=group_size)
        pi = _softmax(theta)
        path[step + 1] = pi
    return path
