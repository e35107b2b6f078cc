"""Exact minimax values of the transductive online game on a finite class.

The deterministic value is the recursion of Eq. (eq-minimax), the randomized value that of
Eq. (eq-randomized) solved by water-filling, Eq. (eq-waterfill). Both are memoized on the
*reduced* projected class of Eq. (eq-reduction): the version space's distinct label patterns on the
rounds still to come, without the rounds on which it agrees (they cannot cost a mistake) and with
each column's labels renamed ``0, 1, ...`` (only which hypotheses share a label matters).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np

from .classes import FiniteClass

EMPTY = np.zeros((1, 0), dtype=np.int8)
"""The reduced class of a version space with no informative round left: its value is 0."""


def _relabel_columns(matrix: np.ndarray) -> np.ndarray:
    """Rename the labels of each column to ``0, 1, ...`` in increasing order (int8 when they fit,
    which shortens the row comparisons of ``np.unique``)."""
    low, high = int(matrix.min()), int(matrix.max())
    if high - low < 256:
        n_values, inverse = high - low + 1, matrix - low
    else:
        values, inverse = np.unique(matrix, return_inverse=True)
        n_values, inverse = len(values), inverse.reshape(matrix.shape)
    columns = np.arange(matrix.shape[1])
    present = np.zeros((n_values, matrix.shape[1]), dtype=bool)
    present[inverse, columns] = True
    rank = np.cumsum(present, axis=0) - 1
    relabelled = rank[inverse, columns]
    return relabelled.astype(np.int8 if relabelled.max() < 127 else np.int32)


def reduce_class(matrix: np.ndarray) -> np.ndarray:
    """Canonical form of a version space's future labels, Eq. (eq-reduction).

    Drops the columns on which every row agrees, renames labels per column and keeps distinct rows
    (sorted). Both game values depend on the class only through this matrix.
    """
    matrix = np.asarray(matrix)
    if matrix.shape[0] == 0:
        raise ValueError("an empty version space has no value: the labels were not realizable")
    informative = (matrix != matrix[0]).any(axis=0)
    if not informative.any():
        return EMPTY
    return np.unique(_relabel_columns(matrix[:, informative]), axis=0)


def _key(reduced: np.ndarray) -> tuple:
    return reduced.shape, reduced.tobytes()


def _children(reduced: np.ndarray) -> list[np.ndarray]:
    """Reduced version spaces after each label of the first informative round."""
    first = reduced[:, 0]
    return [reduce_class(reduced[first == y, 1:]) for y in np.unique(first)]


def deterministic_combine(values: Sequence[int]) -> int:
    """Eq. (eq-minimax): ``max(v_(1), 1 + v_(2))`` over the children's values (at least two)."""
    top = sorted(values, reverse=True)
    return max(top[0], 1 + top[1])


def water_filling(values: Sequence[Fraction]) -> tuple[Fraction, list[Fraction]]:
    """Solve :math:`\\min_p \\max_y (1 - p_y + v_y)`, Eq. (eq-waterfill), exactly.

    Returns the value :math:`\\lambda^*` and the optimal distribution
    :math:`p_y = (1 + v_y - \\lambda^*)_+`, in the order of ``values``.
    """
    if len(values) == 0:
        raise ValueError("water-filling needs at least one label")
    levels = sorted((1 + Fraction(v) for v in values), reverse=True)
    total, level = Fraction(0), Fraction(0)
    for k, a in enumerate(levels, start=1):
        candidate = (total + a - 1) / k
        if a <= candidate:
            break
        total, level = total + a, candidate
    probabilities = [max(Fraction(0), 1 + Fraction(v) - level) for v in values]
    return level, probabilities


def randomized_combine(values: Sequence[Fraction]) -> Fraction:
    """Eq. (eq-randomized): the water level of the children's values."""
    return water_filling(values)[0]


class MinimaxSolver:
    """Exact game values on finite classes, memoized on reduced classes when ``memoize`` is true.

    ``expanded`` counts the states whose children were computed, a machine-independent measure of
    the work done.
    """

    def __init__(self, memoize: bool = True):
        self.memoize = memoize
        self.expanded = 0
        self._caches: dict[str, dict] = {"deterministic": {}, "randomized": {}}

    def deterministic(self, matrix) -> int:
        """The minimax number of mistakes of a deterministic learner, Eq. (eq-minimax)."""
        return self._value(_matrix_of(matrix), deterministic_combine, 0, "deterministic")

    def randomized(self, matrix) -> Fraction:
        """The minimax expected number of mistakes of a randomized learner, Eq. (eq-randomized)."""
        return self._value(_matrix_of(matrix), randomized_combine, Fraction(0), "randomized")

    def _value(self, matrix: np.ndarray, combine: Callable, zero, kind: str):
        """Post-order evaluation with an explicit stack (paths can be longer than Python's
        recursion limit); a child already in the cache is not expanded again."""
        cache = self._caches[kind]
        root = reduce_class(matrix)
        if root.shape[1] == 0:
            return zero
        if self.memoize and _key(root) in cache:
            return cache[_key(root)]
        stack = [[root, _children(root), []]]
        self.expanded += 1
        while True:
            node, children, values = stack[-1]
            if len(values) < len(children):
                child = children[len(values)]
                if child.shape[1] == 0:
                    values.append(zero)
                elif self.memoize and _key(child) in cache:
                    values.append(cache[_key(child)])
                else:
                    stack.append([child, _children(child), []])
                    self.expanded += 1
                continue
            value = combine(values)
            if self.memoize:
                cache[_key(node)] = value
            stack.pop()
            if not stack:
                return value
            stack[-1][2].append(value)


def _matrix_of(cls) -> np.ndarray:
    if isinstance(cls, FiniteClass):
        return cls.matrix
    array = np.asarray(cls)
    if array.ndim != 2 or not np.issubdtype(array.dtype, np.integer):
        raise TypeError("expected a FiniteClass or a 2-D integer label matrix")
    return array


def minimax_mistakes(cls, solver: MinimaxSolver | None = None) -> int:
    """:math:`M(\\mathcal H, 1)`: optimal worst-case mistakes of a deterministic learner,
    Eq. (eq-minimax)."""
    return (solver or MinimaxSolver()).deterministic(cls)


def randomized_minimax_value(cls, solver: MinimaxSolver | None = None) -> Fraction:
    """:math:`\\mathcal V(\\mathcal H, 1)`: optimal expected mistakes, Eq. (eq-randomized)."""
    return (solver or MinimaxSolver()).randomized(cls)


def worst_prior_value(cls, solver: MinimaxSolver | None = None) -> tuple[Fraction, np.ndarray]:
    """The dual recursion, Eq. (eq-dual): the least Bayes risk under the prior that, in every
    state, picks a label uniformly among the support of the water-filling distribution.

    Returns ``(risk, prior)``: ``risk`` is the expected number of mistakes of the best learner
    (which predicts a most probable label) when the target is drawn from ``prior``, and
    ``prior[h]`` is the probability of row ``h`` (duplicate rows share their pattern's mass, the
    first copy gets it). Against fixed targets no randomized learner can beat ``risk``; the tests
    check that it equals :math:`\\mathcal V(\\mathcal H, 1)`. Exponential in the number of
    hypotheses' patterns: for small classes.
    """
    solver = solver or MinimaxSolver()
    matrix = _matrix_of(cls)
    if matrix.shape[0] == 0:
        raise ValueError("the class is empty")
    prior = np.zeros(matrix.shape[0], dtype=object)
    prior[:] = Fraction(0)

    def walk(rows: np.ndarray, t: int, mass: Fraction) -> Fraction:
        while t < matrix.shape[1] and (matrix[rows, t] == matrix[rows[0], t]).all():
            t += 1
        if t == matrix.shape[1]:
            prior[rows[0]] += mass
            return Fraction(0)
        labels = np.unique(matrix[rows, t])
        children = [rows[matrix[rows, t] == y] for y in labels]
        values = [solver.randomized(matrix[child, t + 1:]) for child in children]
        _, probabilities = water_filling(values)
        support = [child for child, p in zip(children, probabilities, strict=True) if p > 0]
        share = Fraction(1, len(support))
        return (1 - share) + sum(share * walk(child, t + 1, mass * share) for child in support)

    risk = walk(np.arange(matrix.shape[0]), 0, Fraction(1))
    return risk, prior
