"""Learners, the minimax adversary and the game loop of transductive online learning.

Every learner sees the whole class projected on the known sequence at ``reset`` (the instances are
known in advance), then predicts round by round and sees each true label after predicting.
Deterministic learners implement ``predict``; randomized ones implement ``distribution`` and the
game samples from it, while also recording the exact expected number of mistakes.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .classes import FiniteClass, check_realizable
from .minimax import MinimaxSolver, water_filling


class _VersionSpace:
    """The hypotheses (row indices) that agree with every label seen so far."""

    def reset(self, cls: FiniteClass) -> None:
        self.cls = cls
        self.version = np.arange(cls.n_hypotheses)

    def update(self, t: int, y: int) -> None:
        self.version = self.version[self.cls.matrix[self.version, t] == y]

    def split(self, t: int) -> tuple[np.ndarray, list[np.ndarray] | None]:
        """The labels :math:`Y_t(V)` and, when there are several, each label's future label
        matrix (the version space after that label, on rounds ``t + 1, ...``)."""
        column = self.cls.matrix[self.version, t]
        if (column == column[0]).all():
            return column[:1], None
        labels = np.unique(column)
        futures = [self.cls.matrix[self.version[column == y], t + 1:] for y in labels]
        return labels, futures


class MinimaxLearner(_VersionSpace):
    """Deterministic minimax learner: predict the label whose version space has the largest
    value :math:`v_y` in Eq. (eq-minimax); ties go to the smallest label. It makes at most
    :math:`M(\\mathcal H, 1)` mistakes on every realizable sequence."""

    def __init__(self, solver: MinimaxSolver | None = None):
        self.solver = solver or MinimaxSolver()

    def predict(self, t: int) -> int:
        labels, futures = self.split(t)
        if futures is None:
            return int(labels[0])
        values = [self.solver.deterministic(future) for future in futures]
        return int(labels[int(np.argmax(values))])


class RandomizedMinimaxLearner(_VersionSpace):
    """Randomized minimax learner: the water-filling distribution of Eq. (eq-waterfill).
    Expected mistakes <= :math:`\\mathcal V(\\mathcal H, 1)` against any adaptive adversary."""

    def __init__(self, solver: MinimaxSolver | None = None):
        self.solver = solver or MinimaxSolver()

    def distribution(self, t: int) -> dict[int, Fraction]:
        labels, futures = self.split(t)
        if futures is None:
            return {int(labels[0]): Fraction(1)}
        _, probabilities = water_filling([self.solver.randomized(f) for f in futures])
        return {int(y): p for y, p in zip(labels, probabilities, strict=True)}


class HalvingLearner(_VersionSpace):
    """Doubling-epoch halving baseline, Eq. (eq-halving).

    Epoch ``j`` holds rounds :math:`2^j, \\dots, 2^{j+1} - 1` (1-based). At its start the learner
    projects the version space on the epoch's points; in each round it predicts the label taken by
    most of the surviving distinct patterns (ties: smallest label).
    """

    def reset(self, cls: FiniteClass) -> None:
        super().reset(cls)
        self._epoch = -1

    def _start_epoch(self, t: int) -> None:
        self._epoch = (t + 1).bit_length() - 1
        self._first = 2**self._epoch - 1
        last = min(2 ** (self._epoch + 1) - 1, self.cls.n_points)
        rows = self.cls.matrix[self.version][:, self._first:last]
        self._patterns = np.unique(rows, axis=0)
        self._alive = np.ones(len(self._patterns), dtype=bool)

    def predict(self, t: int) -> int:
        if (t + 1).bit_length() - 1 != self._epoch:
            self._start_epoch(t)
        labels, counts = np.unique(self._patterns[self._alive, t - self._first],
                                   return_counts=True)
        return int(labels[int(np.argmax(counts))])

    def update(self, t: int, y: int) -> None:
        super().update(t, y)
        self._alive &= self._patterns[:, t - self._first] == y


class MemorizingLearner:
    """Predict the label last seen on the same instance, else ``default``.

    On the disjoint-blocks class with default 0 it errs only on the first appearance of each point
    of the target's support, so at most :math:`d` times for a target inside block :math:`X_d`.
    """

    def __init__(self, default: int = 0):
        self.default = default

    def reset(self, cls: FiniteClass) -> None:
        self.points, self.memory = cls.points, {}

    def predict(self, t: int) -> int:
        return self.memory.get(self.points[t], self.default)

    def update(self, t: int, y: int) -> None:
        self.memory[self.points[t]] = int(y)


@dataclass(frozen=True)
class GameResult:
    """One game: the labels, the predictions and the cumulative (expected) mistakes per round."""

    labels: np.ndarray
    predictions: np.ndarray
    mistakes: np.ndarray
    expected_mistakes: np.ndarray | None = None

    @property
    def total(self) -> int:
        return int(self.mistakes[-1]) if len(self.mistakes) else 0

    @property
    def expected_total(self) -> Fraction:
        if self.expected_mistakes is None:
            raise ValueError("only randomized learners have an expected number of mistakes")
        return self.expected_mistakes[-1] if len(self.expected_mistakes) else Fraction(0)


def _sample(distribution: dict[int, Fraction], rng: np.random.Generator) -> int:
    labels = list(distribution)
    weights = np.array([float(distribution[y]) for y in labels])
    return int(labels[rng.choice(len(labels), p=weights / weights.sum())])


def play(learner, cls: FiniteClass, labels, rng: np.random.Generator | None = None) -> GameResult:
    """Run ``learner`` on the known sequence of ``cls`` against fixed (oblivious) ``labels``.

    Labels outside every hypothesis, or not realizable by the class, raise ``ValueError`` naming
    the round.
    """
    labels = check_realizable(cls, labels)
    randomized = hasattr(learner, "distribution")
    if randomized and rng is None:
        raise ValueError("a randomized learner needs an rng to sample its predictions")
    learner.reset(cls)
    predictions, expected = [], []
    for t, y in enumerate(labels):
        if randomized:
            distribution = learner.distribution(t)
            expected.append(1 - distribution.get(int(y), Fraction(0)))
            predictions.append(_sample(distribution, rng))
        else:
            predictions.append(learner.predict(t))
        learner.update(t, int(y))
    predictions = np.array(predictions, dtype=np.int64)
    return GameResult(labels, predictions, np.cumsum(predictions != labels),
                      _cumulative(expected) if randomized else None)


def _cumulative(values: list[Fraction]) -> np.ndarray:
    out, total = [], Fraction(0)
    for v in values:
        total += v
        out.append(total)
    return np.array(out, dtype=object)


def play_adversary(learner, cls: FiniteClass, solver: MinimaxSolver | None = None) -> GameResult:
    """The minimax adversary: knowing the learner's prediction (or its distribution, not its coin),
    it picks the realizable label maximizing :math:`1[y \\ne \\hat y] + v_y` (or
    :math:`1 - p_y + v_y`). It forces at least :math:`M` mistakes on any deterministic learner and
    :math:`\\mathcal V` expected mistakes on any randomized one (Eqs. eq-minimax, eq-randomized)."""
    solver = solver or MinimaxSolver()
    randomized = hasattr(learner, "distribution")
    state = _VersionSpace()
    state.reset(cls)
    learner.reset(cls)
    labels, predictions, expected = [], [], []
    for t in range(cls.n_points):
        options, futures = state.split(t)
        if futures is None:
            futures = [state.cls.matrix[state.version, t + 1:]]
        if randomized:
            distribution = learner.distribution(t)
            scores = [1 - distribution.get(int(y), Fraction(0)) + solver.randomized(f)
                      for y, f in zip(options, futures, strict=True)]
        else:
            guess = learner.predict(t)
            scores = [int(y != guess) + solver.deterministic(f)
                      for y, f in zip(options, futures, strict=True)]
        y = int(options[int(np.argmax(scores))])
        if randomized:
            expected.append(1 - distribution.get(y, Fraction(0)))
            guess = max(distribution, key=distribution.get)
        labels.append(y)
        predictions.append(guess)
        learner.update(t, y)
        state.update(t, y)
    labels, predictions = np.array(labels, dtype=np.int64), np.array(predictions, dtype=np.int64)
    return GameResult(labels, predictions, np.cumsum(predictions != labels),
                      _cumulative(expected) if randomized else None)


def worst_case_mistakes(learner, cls: FiniteClass) -> int:
    """Largest number of mistakes of a deterministic ``learner`` over every target in ``cls``
    (for a deterministic learner, an adaptive adversary can do no better than the worst target)."""
    if hasattr(learner, "distribution"):
        raise TypeError("worst_case_mistakes takes a deterministic learner")
    return max(play(learner, cls, row).total for row in np.unique(cls.matrix, axis=0))
