"""Exercise tol-ex-bounds: the deterministic value by plain recursion, and M/2 <= V <= M.

The exercise asks for the recursion itself: while the submission answers, the library's solvers
raise, and a submitted function that names them fails the check.
"""

from fractions import Fraction

import icml26.transductive_online as to

OK_FORMAT = False
name = "tol-ex-bounds"
points = 3
forbid = ("icml26.transductive_online.minimax_mistakes",
          "icml26.transductive_online.MinimaxSolver.deterministic")


def test_matches_the_library_and_the_bounds(deterministic_value, rng):
    matrices = [rng.integers(0, 4, size=(rng.integers(1, 10), rng.integers(1, 6)))
                for _ in range(25)]
    for matrix, det in zip(matrices, deterministic_value.map((m,) for m in matrices),
                           strict=True):
        assert det == to.minimax_mistakes(matrix), matrix
        assert Fraction(det, 2) <= to.randomized_minimax_value(matrix) <= det


def test_closed_forms(deterministic_value):
    for n in range(1, 7):
        assert deterministic_value(to.all_functions(n).matrix) == n
        assert deterministic_value(to.sparse_multiclass(n, 3).matrix) == 1
