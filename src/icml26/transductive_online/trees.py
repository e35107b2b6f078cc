"""Level-constrained trees on finite domains: dimensions, and a bounded-depth LCLL tree search.

* Level-constrained Littlestone tree on an ordered sequence of points (Eq. eq-lc-shatter): every
  node on level ``i`` is labelled by the same point ``x_i``, its two edges by distinct labels, and
  the tree is shattered when every root-to-leaf path is consistent with some hypothesis.
* Level-constrained branching on a sequence equals the deterministic minimax value (Eq.
  eq-branching); on a domain it is a maximum over orderings of the points.
* LCLL tree (our reconstruction, marked in the chapter as inferred): a Littlestone-type tree
  whose node at depth ``k`` holds a level-constrained Littlestone tree of depth ``k + 1``, with one
  child per leaf of that tree (Eq. eq-lcll).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from .classes import FiniteClass
from .minimax import MinimaxSolver, reduce_class


@dataclass(frozen=True)
class LCNode:
    """A node of a level-constrained tree: its point (a column) and two ``(label, subtree)`` edges.

    A subtree is another :class:`LCNode`, an :class:`LCLLNode` (inside an LCLL tree), or, at a
    leaf, the index of one hypothesis consistent with the path.
    """

    point: int
    branches: tuple[tuple[int, LCNode | LCLLNode | int], ...]


@dataclass(frozen=True)
class LCLLNode:
    """A node of an LCLL tree: its points and the level-constrained tree it holds on them."""

    points: tuple[int, ...]
    tree: LCNode


def _informative(matrix: np.ndarray, rows: np.ndarray) -> list[int]:
    """Columns on which the hypotheses ``rows`` do not all agree."""
    block = matrix[rows]
    return [int(c) for c in np.flatnonzero((block != block[0]).any(axis=0))]


def _split(matrix: np.ndarray, rows: np.ndarray, column: int) -> list[tuple[int, np.ndarray]]:
    labels = matrix[rows, column]
    return [(int(y), rows[labels == y]) for y in np.unique(labels)]


def _key(matrix: np.ndarray, rows: np.ndarray, columns) -> tuple:
    block = reduce_class(matrix[np.ix_(rows, list(columns))]) if len(columns) else None
    return None if block is None else (block.shape, block.tobytes())


def level_constrained_tree(cls: FiniteClass, order) -> LCNode | None:
    """A shattered level-constrained Littlestone tree on the points ``order`` (Eq. eq-lc-shatter),
    or ``None`` when there is none. Among the labels of a node, the two smallest that work are used.
    """
    order = tuple(int(c) for c in order)
    if not order:
        raise ValueError("a level-constrained tree needs at least one point")
    rows = np.arange(cls.n_hypotheses)
    return _lc_tree(cls.matrix, rows, order, 0, leaf=lambda found: int(found[0]))


def _lc_tree(matrix, rows, order, level, leaf):
    """Depth-first search for a level-constrained tree on ``order[level:]`` above ``rows``; at the
    bottom, ``leaf(rows)`` returns the subtree hung there (``None`` if it fails)."""
    if level == len(order):
        return leaf(rows)
    found = []
    splits = sorted(_split(matrix, rows, order[level]), key=lambda split: len(split[1]))
    for tried, (y, sub) in enumerate(splits):  # small version spaces first: they fail soonest
        if len(found) + len(splits) - tried < 2:
            return None
        subtree = _lc_tree(matrix, sub, order, level + 1, leaf)
        if subtree is not None:
            found.append((y, subtree))
            if len(found) == 2:
                return LCNode(order[level], tuple(sorted(found)))
    return None


def is_binary(cls: FiniteClass) -> bool:
    """Whether every point takes at most two labels."""
    return all(len(cls.labels_at(t)) <= 2 for t in range(cls.n_points))


def level_constrained_dimension(cls: FiniteClass) -> tuple[int, tuple[int, ...]]:
    """:math:`D(\\mathcal H)` on a finite domain and a longest shattered ordered sequence.

    Shattered sequences are prefix-closed, so a depth-first search extends shattered prefixes only.
    For binary classes a sequence is shattered exactly when all :math:`2^d` patterns appear, so the
    order is irrelevant and only increasing sequences are searched.
    """
    matrix, rows = cls.matrix, np.arange(cls.n_hypotheses)
    candidates = _informative(matrix, rows)
    binary = is_binary(cls)
    failed: set = set()
    best: tuple[int, ...] = ()

    def shattered(order) -> bool:
        key = _key(matrix, rows, order)
        if key in failed:
            return False
        ok = _lc_tree(matrix, rows, order, 0, leaf=lambda r: int(r[0])) is not None
        if not ok:
            failed.add(key)
        return ok

    def search(order: tuple[int, ...]) -> bool:
        nonlocal best
        if len(order) > len(best):
            best = order
        if len(best) == len(candidates):
            return True
        last = order[-1] if order and binary else -1
        rest = [c for c in candidates if c not in order and c > last]
        return any(shattered(order + (c,)) and search(order + (c,)) for c in rest)

    search(())
    return len(best), best


def littlestone_dimension(cls: FiniteClass) -> int:
    """Multiclass Littlestone dimension on a finite domain (no level constraint: each node of the
    tree picks its own point). It bounds the minimax value of every ordering of the domain."""
    cache: dict = {}

    def depth(reduced: np.ndarray) -> int:
        if reduced.shape[1] == 0:
            return 0
        key = (reduced.shape, reduced.tobytes())
        if key not in cache:
            best = 0
            for column in range(reduced.shape[1]):
                labels = reduced[:, column]
                values = sorted((depth(reduce_class(reduced[labels == y]))
                                 for y in np.unique(labels)), reverse=True)
                best = max(best, 1 + values[1])
            cache[key] = best
        return cache[key]

    return depth(reduce_class(cls.matrix))


def level_constrained_branching(cls: FiniteClass, solver: MinimaxSolver | None = None):
    """The level-constrained branching quantity on a finite domain and an ordering attaining it.

    On a fixed ordering the branching quantity is the minimax value (Eq. eq-branching). Appending
    points never lowers it, so the maximum over all sequences of distinct points is attained by a
    full ordering; the search stops early at the Littlestone dimension, an upper bound.
    """
    solver = solver or MinimaxSolver()
    reduced = reduce_class(cls.matrix)
    bound = littlestone_dimension(cls)
    best, best_order = 0, tuple(range(reduced.shape[1]))
    for order in itertools.permutations(range(reduced.shape[1])):
        value = solver.deterministic(reduced[:, list(order)])
        if value > best:
            best, best_order = value, order
        if best == bound:
            break
    return best, best_order


def find_lcll_tree(cls: FiniteClass, depth: int) -> LCLLNode | int | None:
    """Search a shattered LCLL tree of the given depth (Eq. eq-lcll, our reconstruction).

    The node at depth ``k`` picks ``k + 1`` distinct points and a shattered level-constrained tree
    on them; below each of its leaves hangs a node of depth ``k + 1``, built from the hypotheses
    consistent with that leaf's path. Depth 0 is any single hypothesis. Failures are memoized on
    the reduced projected class. For binary classes a node's tree is shattered exactly when all
    patterns of its points appear, whatever their order, so only sets of points are tried.
    """
    if depth < 0:
        raise ValueError(f"depth must be non-negative, got {depth}")
    matrix = cls.matrix
    choose = itertools.combinations if is_binary(cls) else itertools.permutations
    failed: set = set()

    def node(rows: np.ndarray, k: int):
        if k == depth:
            return int(rows[0])
        columns = _informative(matrix, rows)
        if len(columns) < (k + 1 + depth) * (depth - k) // 2:
            return None  # every path needs k + 1, ..., depth fresh points below this node
        key = (_key(matrix, rows, columns), k)
        if key in failed:
            return None
        for points in choose(columns, k + 1):
            tree = _lc_tree(matrix, rows, points, 0, leaf=lambda r, k=k: node(r, k + 1))
            if tree is not None:
                return LCLLNode(points, tree)
        failed.add(key)
        return None

    return node(np.arange(cls.n_hypotheses), 0)


def lcll_depth(cls: FiniteClass, max_depth: int) -> int:
    """The largest depth ``<= max_depth`` of a shattered LCLL tree (our reconstruction)."""
    depth = 0
    while depth < max_depth and find_lcll_tree(cls, depth + 1) is not None:
        depth += 1
    return depth


def lc_paths(tree: LCNode):
    """Every root-to-leaf path of a level-constrained tree: ``(constraints, leaf subtree)``."""
    for label, child in tree.branches:
        if isinstance(child, LCNode):
            for path, leaf in lc_paths(child):
                yield ((tree.point, label),) + path, leaf
        else:
            yield ((tree.point, label),), child


def verify_lcll_tree(cls: FiniteClass, root: LCLLNode | int, depth: int) -> bool:
    """Check an LCLL tree independently of the search: node depths, the level constraint, two
    distinct labels per node, distinct points per node and a consistent hypothesis on every
    path."""

    def levels_ok(tree: LCNode, points: tuple[int, ...], level: int) -> bool:
        labels = [label for label, _ in tree.branches]
        if tree.point != points[level] or len(set(labels)) != 2 or len(labels) != 2:
            return False
        return all(levels_ok(child, points, level + 1) for _, child in tree.branches
                   if isinstance(child, LCNode))

    def check(node, constraints: tuple, k: int) -> bool:
        if k == depth:
            return isinstance(node, int | np.integer) and _realizable(cls, constraints)
        if not isinstance(node, LCLLNode) or len(node.points) != k + 1:
            return False
        if len(set(node.points)) != k + 1 or not levels_ok(node.tree, node.points, 0):
            return False
        return all(len(path) == k + 1 and check(leaf, constraints + path, k + 1)
                   for path, leaf in lc_paths(node.tree))

    return check(root, (), 0)


def _realizable(cls: FiniteClass, constraints) -> bool:
    """Whether some hypothesis satisfies every ``(point, label)`` constraint."""
    agree = np.ones(cls.n_hypotheses, dtype=bool)
    for point, label in constraints:
        agree &= cls.matrix[:, point] == label
    return bool(agree.any())
