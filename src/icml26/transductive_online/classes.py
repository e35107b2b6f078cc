"""Finite concept classes, stored as their projection on a known sequence of instances.

A class :math:`\\mathcal H` enters every computation of the chapter through its projection on the
known instances :math:`x_1, \\dots, x_n`: the matrix whose row ``h`` and column ``t`` hold
:math:`h(x_t)`. Infinite classes (all thresholds, infinitely many labels) become finite this way,
because only finitely many label patterns can appear on finitely many points.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np


@dataclass(frozen=True, eq=False)
class FiniteClass:
    """A class projected on a sequence: ``matrix[h, t]`` is the label ``h`` gives ``x_t``.

    ``points`` names the instances (repeats allowed: a repeated instance is a repeated column).
    """

    matrix: np.ndarray
    points: tuple

    def __post_init__(self) -> None:
        matrix = _as_label_matrix(self.matrix)
        if len(self.points) != matrix.shape[1]:
            raise ValueError(f"{len(self.points)} points given for {matrix.shape[1]} columns")
        object.__setattr__(self, "matrix", matrix)

    @property
    def n_hypotheses(self) -> int:
        return self.matrix.shape[0]

    @property
    def n_points(self) -> int:
        return self.matrix.shape[1]

    def labels_at(self, t: int) -> np.ndarray:
        """The labels some hypothesis gives ``x_t`` (0-based round ``t``), sorted: :math:`Y_t`."""
        return np.unique(self.matrix[:, t])

    def restrict(self, columns: Sequence[int]) -> FiniteClass:
        """The class projected on the sub-sequence ``columns`` (repeats allowed)."""
        columns = list(columns)
        return FiniteClass(self.matrix[:, columns], tuple(self.points[c] for c in columns))


def _as_label_matrix(matrix) -> np.ndarray:
    """Validate a label matrix: 2-D, integer labels, at least one hypothesis; return a copy."""
    array = np.asarray(matrix)
    if array.ndim != 2:
        raise ValueError(f"a class is a 2-D label matrix (hypotheses x points), got {array.ndim}-D")
    if array.dtype == bool:
        array = array.astype(np.int64)
    if not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"labels must be integers, got dtype {array.dtype}")
    if array.shape[0] == 0:
        raise ValueError("the class is empty: no hypothesis can label round 1")
    array = array.astype(np.int64)
    array.setflags(write=False)
    return array


def finite_class(matrix, points: Sequence[Hashable] | None = None) -> FiniteClass:
    """A :class:`FiniteClass` from a label matrix; points default to ``0, 1, ..., n - 1``."""
    array = _as_label_matrix(matrix)
    return FiniteClass(array, tuple(range(array.shape[1])) if points is None else tuple(points))


def project(hypotheses: Sequence[Callable[[Hashable], int]], points: Sequence[Hashable]):
    """Project callables ``h(x) -> label`` on ``points``: the class as the game sees it."""
    if not hypotheses:
        raise ValueError("the class is empty: no hypothesis can label round 1")
    return finite_class([[h(x) for x in points] for h in hypotheses], points)


def dyadic_points(n: int) -> list[Fraction]:
    """The first ``n`` dyadic rationals in level order: 1/2, 1/4, 3/4, 1/8, 3/8, 5/8, 7/8, ..."""
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    points, level = [], 1
    while len(points) < n:
        points.extend(Fraction(k, 2**level) for k in range(1, 2**level, 2))
        level += 1
    return points[:n]


def thresholds(points: Sequence) -> FiniteClass:
    """All threshold functions :math:`h_\\theta(x) = 1[x \\ge \\theta]` projected on ``points``.

    With ``k`` distinct values among the points there are exactly ``k + 1`` patterns, one per gap.
    """
    values = np.array([float(p) for p in points])
    ranks = np.searchsorted(np.unique(values), values)
    cuts = np.arange(len(np.unique(values)) + 1)[:, None]
    return finite_class((ranks[None, :] >= cuts).astype(np.int64), points)


def all_functions(n_points: int, n_labels: int = 2) -> FiniteClass:
    """Every function from ``n_points`` points to ``{0, ..., n_labels - 1}``."""
    if n_points < 0 or n_labels < 1:
        raise ValueError("need n_points >= 0 and n_labels >= 1")
    rows = list(itertools.product(range(n_labels), repeat=n_points))
    return finite_class(np.array(rows, dtype=np.int64).reshape(len(rows), n_points))


def disjoint_blocks(sizes: Sequence[int]) -> FiniteClass:
    """The disjoint-blocks class on blocks :math:`X_d` of the given sizes.

    It holds the zero function and every binary function supported inside a single block. Points
    are pairs ``(d, i)``: the ``i``-th point of the block of size ``d``.
    """
    if len(set(sizes)) != len(sizes) or any(d < 1 for d in sizes):
        raise ValueError(f"block sizes must be distinct positive integers, got {list(sizes)}")
    points = [(d, i) for d in sizes for i in range(d)]
    rows = [np.zeros(len(points), dtype=np.int64)]
    start = 0
    for d in sizes:
        for pattern in itertools.product((0, 1), repeat=d):
            if any(pattern):
                row = np.zeros(len(points), dtype=np.int64)
                row[start:start + d] = pattern
                rows.append(row)
        start += d
    return finite_class(np.array(rows), points)


def sparse_multiclass(n_points: int, max_label: int) -> FiniteClass:
    """:math:`h_{a,k}(x) = k\\,1[x = a]` truncated to labels ``k <= max_label``, plus zero.

    The untruncated class has infinitely many labels; every truncation is finite.
    """
    if n_points < 0 or max_label < 1:
        raise ValueError("need n_points >= 0 and max_label >= 1")
    rows = [np.zeros(n_points, dtype=np.int64)]
    for a in range(n_points):
        for k in range(1, max_label + 1):
            row = np.zeros(n_points, dtype=np.int64)
            row[a] = k
            rows.append(row)
    return finite_class(np.array(rows).reshape(len(rows), n_points))


def check_realizable(cls: FiniteClass, labels: Sequence[int]) -> np.ndarray:
    """Return ``labels`` as an array, or raise naming the first round that breaks realizability.

    A label no hypothesis gives at that point, and a label sequence no single hypothesis agrees
    with, are both errors; the chapter's notion of realizable is one hypothesis for all rounds.
    """
    array = np.asarray(labels)
    if array.ndim != 1 or len(array) != cls.n_points:
        raise ValueError(f"need one label per round ({cls.n_points}), got shape {array.shape}")
    if len(array) and not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"labels must be integers, got dtype {array.dtype}")
    agree = cls.matrix == array[None, :]
    allowed = agree.any(axis=0)
    realizable = np.logical_and.accumulate(agree, axis=1).any(axis=0)
    if not realizable.all():
        t = int(np.argmin(realizable))
        if not allowed[t]:
            raise ValueError(f"round {t + 1}: label {array[t]} is outside every hypothesis at "
                             f"x_{t + 1} (the class allows {cls.labels_at(t).tolist()})")
        raise ValueError(f"round {t + 1}: the labels of rounds 1..{t + 1} are not realizable "
                         "by the class (no hypothesis agrees with all of them)")
    return array.astype(np.int64)
