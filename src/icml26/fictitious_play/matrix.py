"""Fictitious play and smooth fictitious play in two-player matrix games.

The belief of each player is the empirical (time-averaged) play of the other, Eq.
(eq-sfp-belief). Fictitious play (FP) best-responds to it exactly; smooth fictitious play (sFP)
plays the logit (entropy-smoothed) response of Eq. (eq-sfp-logit). Written as follow-the-
regularized-leader, sFP has the average-regret bound of Eq. (eq-sfp-bound).

Both dynamics follow ``nashpy.Game.fictitious_play`` and ``nashpy.Game.stochastic_fictitious_play``
draw for draw: with a ``numpy.random.RandomState`` seeded like ``numpy.random.seed`` they give the
same plays (the unit tests check this).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from icml26.core import check_count, check_positive


def check_game(A, B=None) -> tuple[np.ndarray, np.ndarray]:
    """Payoff matrices of the row player (``A``) and column player (``B``), checked.

    ``B`` defaults to ``-A`` (a zero-sum game). Both must be finite 2-D arrays of one shape.
    """
    A = np.asarray(A, dtype=float)
    B = -A if B is None else np.asarray(B, dtype=float)
    if A.ndim != 2 or B.ndim != 2:
        raise ValueError(f"payoff matrices must be 2-D, got shapes {A.shape} and {B.shape}")
    if A.shape != B.shape:
        raise ValueError(f"payoff matrices must have the same shape, got {A.shape} and {B.shape}")
    if min(A.shape) < 1:
        raise ValueError(f"each player needs at least one action, got shape {A.shape}")
    if not (np.all(np.isfinite(A)) and np.all(np.isfinite(B))):
        raise ValueError("payoff matrices contain NaN or infinite entries")
    return A, B


def rock_paper_scissors() -> tuple[np.ndarray, np.ndarray]:
    """Rock-paper-scissors: zero-sum, unique equilibrium (1/3, 1/3, 1/3) for both players."""
    A = np.array([[0.0, -1.0, 1.0], [1.0, 0.0, -1.0], [-1.0, 1.0, 0.0]])
    return A, -A


def shapley_game() -> tuple[np.ndarray, np.ndarray]:
    """Shapley's (1964) 3x3 game, on which fictitious play cycles with ever longer cycles.

    The unique equilibrium has both players uniform; the game is not zero-sum.
    """
    A = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    B = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    return A, B


def smooth_best_response(utilities, tau: float) -> np.ndarray:
    """Logit response ``softmax(u / tau)``, maximiser of ``<s, u> + tau H(s)``, Eq. (eq-sfp-logit).

    ``utilities`` is a vector (or a stack of vectors along the last axis); ``tau > 0``.
    """
    tau = check_positive(tau, "tau")
    u = np.asarray(utilities, dtype=float)
    if u.ndim < 1 or u.shape[-1] < 1:
        raise ValueError("utilities must have at least one action along the last axis")
    if not np.all(np.isfinite(u)):
        raise ValueError("utilities contain NaN or infinite values")
    z = (u - u.max(axis=-1, keepdims=True)) / tau
    w = np.exp(z)
    return w / w.sum(axis=-1, keepdims=True)


def entropy(strategy) -> float:
    """Shannon entropy (nats) of a mixed strategy."""
    p = np.asarray(strategy, dtype=float)
    nz = p[p > 0]
    return float(-(nz * np.log(nz)).sum())


@dataclass(frozen=True)
class MatrixPlay:
    """A run of (smooth) fictitious play: the plays and the mixed strategies behind them.

    ``strategies[i][t]`` is the mixed strategy player ``i`` used in step ``t`` (one-hot for FP),
    ``actions[i][t]`` the action it played, and ``counts[i][t]`` its play counts *after* step
    ``t`` (the quantity ``nashpy`` yields).
    """

    A: np.ndarray
    B: np.ndarray
    actions: tuple[np.ndarray, np.ndarray]
    strategies: tuple[np.ndarray, np.ndarray]

    @property
    def iterations(self) -> int:
        return int(self.actions[0].size)

    @property
    def counts(self) -> tuple[np.ndarray, np.ndarray]:
        return tuple(np.cumsum(np.eye(m, dtype=int)[a], axis=0)
                     for m, a in zip(self.A.shape, self.actions, strict=True))

    def empirical(self) -> tuple[np.ndarray, np.ndarray]:
        """Time-averaged play of each player after every step: beliefs of Eq. (eq-sfp-belief)."""
        steps = np.arange(1, self.iterations + 1)[:, None]
        return tuple(c / steps for c in self.counts)

    def average_regret(self, player: int = 0, realized: bool = False) -> np.ndarray:
        """Average regret of ``player`` after every step, Eq. (eq-sfp-regret).

        By default the payoff of step ``t`` is the *expected* payoff of the mixed strategy used
        against the opponent's realized action (the quantity the bound controls for any opponent);
        ``realized=True`` uses the player's own sampled action instead.
        """
        if player not in (0, 1):
            raise ValueError(f"player must be 0 (row) or 1 (column), got {player!r}")
        M = self.A if player == 0 else self.B.T  # rows: own actions, columns: opponent's
        own, other = self.actions[player], self.actions[1 - player]
        gains = M[:, other].T  # (K, n_own): payoff of each own action in each step
        if realized:
            got = gains[np.arange(gains.shape[0]), own]
        else:
            got = (self.strategies[player] * gains).sum(axis=1)
        best = np.cumsum(gains, axis=0).max(axis=1)
        steps = np.arange(1, gains.shape[0] + 1)
        return (best - np.cumsum(got)) / steps


def _belief(counts: np.ndarray) -> np.ndarray:
    total = counts.sum()
    return np.full(counts.size, 1.0 / counts.size) if total == 0 else counts / total


def _check_rng(rng):
    if rng is None:
        return np.random.default_rng()
    if not isinstance(rng, (np.random.Generator, np.random.RandomState)):
        raise TypeError(f"rng must be a numpy Generator or RandomState, got {type(rng).__name__}")
    return rng


def fictitious_play(A, B=None, iterations: int = 1000, rng=None) -> MatrixPlay:
    """Fictitious play: each step, each player best-responds to the other's play counts.

    Ties are broken uniformly at random (as in ``nashpy``); cost ``O(m n)`` per step.
    """
    A, B = check_game(A, B)
    iterations = check_count(iterations, "iterations", 1)
    rng = _check_rng(rng)
    mats = (A, B.T)
    counts = [np.zeros(A.shape[0], dtype=int), np.zeros(A.shape[1], dtype=int)]
    actions = [np.empty(iterations, dtype=int), np.empty(iterations, dtype=int)]
    for t in range(iterations):
        plays = []
        for i in (0, 1):
            utilities = mats[i] @ counts[1 - i]
            ties = np.argwhere(utilities == np.max(utilities)).transpose()[0]
            plays.append(int(rng.choice(ties)))
        for i in (0, 1):
            actions[i][t] = plays[i]
            counts[i][plays[i]] += 1
    strategies = tuple(np.eye(m)[a] for m, a in zip(A.shape, actions, strict=True))
    return MatrixPlay(A, B, tuple(actions), strategies)


def stochastic_fictitious_play(A, B=None, iterations: int = 1000, tau: float = 0.1,
                               epsilon_bar: float = 0.0, rng=None) -> MatrixPlay:
    """Smooth (stochastic) fictitious play: sample from the logit response to the belief.

    Step ``t`` plays ``softmax((M @ belief + epsilon_bar * U) / tau)``, ``U`` uniform on
    ``[0, 1]^n`` (``nashpy``'s extra perturbation; ``epsilon_bar = 0`` is Eq. (eq-sfp-logit)).
    ``tau`` is ``nashpy``'s ``etha``. Cost ``O(m n)`` per step.
    """
    A, B = check_game(A, B)
    iterations = check_count(iterations, "iterations", 1)
    tau = check_positive(tau, "tau")
    if isinstance(epsilon_bar, bool) or not np.isfinite(epsilon_bar) or epsilon_bar < 0:
        raise ValueError(f"epsilon_bar must be a non-negative number, got {epsilon_bar!r}")
    rng = _check_rng(rng)
    mats = (A, B.T)
    counts = [np.zeros(A.shape[0]), np.zeros(A.shape[1])]
    actions = [np.empty(iterations, dtype=int), np.empty(iterations, dtype=int)]
    strategies = [np.empty((iterations, A.shape[0])), np.empty((iterations, A.shape[1]))]
    for t in range(iterations):
        dists = []
        for i in (0, 1):
            utilities = mats[i] @ _belief(counts[1 - i])
            noisy = utilities + rng.random(mats[i].shape[0]) * epsilon_bar
            dists.append(smooth_best_response(noisy, tau))
        for i in (0, 1):
            a = int(rng.choice(dists[i].size, p=dists[i]))
            actions[i][t] = a
            strategies[i][t] = dists[i]
            counts[i][a] += 1
    return MatrixPlay(A, B, tuple(actions), tuple(strategies))


def regret_bound(tau: float, n_actions: int, iterations: int, payoff_range: float) -> float:
    """Average-regret bound of smooth fictitious play after ``iterations`` steps (eq-sfp-bound).

    ``tau log n (K-1)/K + (r + r^2 Lambda_{K-1} / (8 tau)) / K``, with ``Lambda_{K-1}`` the
    harmonic number ``sum_{j<K} 1/j`` (zero for ``K = 1``) and ``r`` the range of the player's
    payoffs. It holds for the expected regret against *any* opponent sequence, whatever the
    first move (the first step is charged at most ``r``), for ``epsilon_bar = 0``.
    """
    tau = check_positive(tau, "tau")
    n = check_count(n_actions, "n_actions", 1)
    K = check_count(iterations, "iterations", 1)
    r = float(payoff_range)
    if not np.isfinite(r) or r < 0:
        raise ValueError(f"payoff_range must be a non-negative number, got {payoff_range!r}")
    harmonic = float(np.sum(1.0 / np.arange(1, K))) if K > 1 else 0.0
    return tau * math.log(n) * (K - 1) / K + (r + r**2 * harmonic / (8 * tau)) / K


def against_adversary(A, iterations: int = 1000, tau: float | None = None,
                      rng=None) -> MatrixPlay:
    """The row player runs FP (``tau=None``) or sFP (``tau > 0``) against an adaptive adversary.

    In every step the adversary knows the row player's mixed strategy (for FP: uniform over the
    tied best responses) and plays the column that minimises the row player's expected payoff
    (lowest index on ties). Against plain fictitious play it wins every step in which the
    learner's best response is unique (in rock-paper-scissors two steps in three), while sFP
    keeps the regret bound of Eq. (eq-sfp-bound), which holds against any opponent.
    """
    A, _ = check_game(A)
    iterations = check_count(iterations, "iterations", 1)
    if tau is not None:
        tau = check_positive(tau, "tau")
    rng = _check_rng(rng)
    m, n = A.shape
    seen = np.zeros(n)
    actions = [np.empty(iterations, dtype=int), np.empty(iterations, dtype=int)]
    strategies = [np.empty((iterations, m)), np.zeros((iterations, n))]
    for t in range(iterations):
        utilities = A @ _belief(seen)
        if tau is None:
            best = utilities == utilities.max()
            sigma = best / best.sum()
        else:
            sigma = smooth_best_response(utilities, tau)
        b = int(np.argmin(sigma @ A))
        a = int(rng.choice(m, p=sigma))
        actions[0][t], actions[1][t] = a, b
        strategies[0][t], strategies[1][t, b] = sigma, 1.0
        seen[b] += 1
    return MatrixPlay(A, -A, tuple(actions), tuple(strategies))
