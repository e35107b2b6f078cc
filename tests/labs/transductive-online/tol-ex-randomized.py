"""Exercise tol-ex-randomized: the randomized minimax value by water-filling."""

OK_FORMAT = False
name = "tol-ex-randomized"
points = 3


def test_matches_the_library_and_closed_forms(randomized_value):
    from fractions import Fraction

    import numpy as np

    import icml26.transductive_online as to

    rng = np.random.default_rng(2)
    for _ in range(25):
        matrix = rng.integers(0, 4, size=(rng.integers(1, 10), rng.integers(1, 6)))
        assert randomized_value(matrix) == to.randomized_minimax_value(matrix), matrix
    for n in range(1, 7):
        assert randomized_value(to.all_functions(n).matrix) == Fraction(n, 2)
        assert randomized_value(to.sparse_multiclass(n, 3).matrix) == 1 - Fraction(1, 4) ** n
    assert randomized_value(to.all_functions(2, 3).matrix) == Fraction(4, 3)
