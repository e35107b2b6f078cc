"""Exercise tol-ex-randomized: the randomized minimax value by water-filling.

The exercise asks for one's own recursion and water-filling: while the submission answers, the
library's solvers raise, and a submitted function that names them fails the check.
"""

from fractions import Fraction

import icml26.transductive_online as to

OK_FORMAT = False
name = "tol-ex-randomized"
points = 3
forbid = ("icml26.transductive_online.randomized_minimax_value",
          "icml26.transductive_online.MinimaxSolver.randomized",
          "icml26.transductive_online.water_filling",
          "icml26.transductive_online.minimax.randomized_combine")


def test_matches_the_library(randomized_value, rng):
    matrices = [rng.integers(0, 4, size=(rng.integers(1, 10), rng.integers(1, 6)))
                for _ in range(25)]
    for matrix, value in zip(matrices, randomized_value.map((m,) for m in matrices),
                             strict=True):
        assert value == to.randomized_minimax_value(matrix), matrix


def test_closed_forms(randomized_value):
    for n in range(1, 7):
        assert randomized_value(to.all_functions(n).matrix) == Fraction(n, 2)
        assert randomized_value(to.sparse_multiclass(n, 3).matrix) == 1 - Fraction(1, 4) ** n
    assert randomized_value(to.all_functions(2, 3).matrix) == Fraction(4, 3)
