"""A policy over kernel-writing strategies: reward hacking, lazy optimisation, PR and PRS.

The policy is a softmax over strategies (``lazy``, ``fuse``, ``decoy``). Each rollout draws a
strategy, an environment returns its :class:`Outcomes` (correct? measured and true speed-up,
profiled coverage, caught as a hack?), :func:`kernel_reward` turns them into a reward (Eq.
``eq-drk-reward``, with the profiling-based term of PR), :func:`prs_keep` draws the PRS mask (Eq.
``eq-drk-prs``), and :func:`train_policy` runs REINFORCE with the leave-one-out baseline.
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

    def __post_init__(self):
        for name in ("hack_check", "profiling_reward", "rejection"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool")
        if self.prs_scale <= 0:
            raise ValueError(f"prs_scale must be positive, got {self.prs_scale}")


def kernel_reward(out: Outcomes, config: RewardConfig) -> np.ndarray:
    """Eq. ``eq-drk-reward``: ``1 + clip(s) [+ w kappa]`` if correct, 0 if not, a penalty if caught."""
    low, high = config.speedup_clip
    reward = np.where(out.correct, 1.0 + np.clip(out.measured_speedup, low, high), 0.0)
    if config.profiling_reward:
        reward = reward + np.where(out.correct, config.coverage_weight * out.coverage, 0.0)
    if config.hack_check:
        reward = np.where(out.hacked, config.hack_penalty, reward)
    return reward


def prs_keep_probability(out: Outcomes, config: RewardConfig) -> np.ndarray:
    """Eq. ``eq-drk-prs``: ``clip((kappa - tau) / s, 0, 1)`` for correct samples, 1 otherwise."""
    if not config.rejection:
        return np.ones(out.correct.shape)
    p = np.clip((out.coverage - config.prs_threshold) / config.prs_scale, 0.0, 1.0)
    return np.where(out.correct, p, 1.0)


def prs_keep(out: Outcomes, config: RewardConfig, rng: np.random.Generator) -> np.ndarray:
    """The PRS mask: a Bernoulli draw per rollout with :func:`prs_keep_probability`."""
    return rng.random(out.correct.shape) < prs_keep_probability(out, config)


def synthetic_outcomes(choice: np.ndarray, rng: np.random.Generator) -> Outcomes:
    """The synthetic environment of the E2 experiment.

    ``lazy``: correct w.p. 0.95, speed-up U[0.98, 1.10], coverage U[0.02, 0.15];
    ``fuse``: correct w.p. 0.45, speed-up U[1.3, 2.6], coverage U[0.7, 0.95];
    ``decoy``: passes the correctness check, fools the timer (measured 3), really runs the
    reference (true speed-up 1), coverage 0, and the profiling check always catches it.
    """
    choice = np.asarray(choice)
    n = choice.shape
    lazy, fuse, decoy = (choice == k for k in range(3))
    u = rng.random(n)
    correct = np.where(lazy, u < 0.95, np.where(fuse, u < 0.45, True))
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
    hacked: np.ndarray  # (steps,) share of rollouts caught (or, without the check, undetected) hacks

    @property
    def final(self) -> np.ndarray:
        return self.policy[-1]

    def late_fast12(self, fraction: float = 0.2) -> float:
        """Mean Fast@1.2 share over the last ``fraction`` of the steps."""
        k = max(1, int(round(fraction * self.fast12.size)))
        return float(self.fast12[-k:].mean())


def train_policy(environment: Callable[[np.ndarray, np.random.Generator], Outcomes],
                 config: RewardConfig, *, steps: int, group_size: int = 16, lr: float = 0.1,
                 rng: np.random.Generator, strategies: int = 3) -> PolicyRun:
    """REINFORCE on softmax logits with the leave-one-out baseline and the PRS mask.

    Per step: draw ``group_size`` strategies, get outcomes and rewards, compute leave-one-out
    advantages over the whole group (Eq. ``eq-drk-trloo`` with one turn), then mask the rejected
    samples out of the gradient ``(1/K) sum_i m_i A_i (e_{a_i} - pi)``.
    """
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if isinstance(group_size, bool) or not isinstance(group_size, numbers.Integral):
        raise TypeError("group_size must be an integer")
    if group_size < 2:
        raise ValueError(f"group size must be at least 2, got {group_size}")
    theta = np.zeros(strategies)
    policy = np.empty((steps + 1, strategies))
    fast = np.empty(steps)
    hacked = np.empty(steps)
    eye = np.eye(strategies)
    for step in range(steps):
        pi = np.exp(theta - theta.max())
        pi /= pi.sum()
        policy[step] = pi
        choice = rng.choice(strategies, size=group_size, p=pi)
        out = environment(choice, rng)
        reward = kernel_reward(out, config)
        adv = group_advantages(reward[None], np.ones((1, group_size), bool), "trloo")[0]
        keep = prs_keep(out, config, rng)
        grad = ((keep * adv)[:, None] * (eye[choice] - pi)).sum(0) / group_size
        theta = theta + lr * grad
        fast[step] = np.mean(out.correct & ~out.hacked & (out.true_speedup >= 1.2))
        hacked[step] = np.mean(out.hacked)
    pi = np.exp(theta - theta.max())
    policy[steps] = pi / pi.sum()
    return PolicyRun(policy, fast, hacked)
