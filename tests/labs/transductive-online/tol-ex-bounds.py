"""Exercise tol-ex-bounds: the deterministic value by plain recursion, and M/2 <= V <= M."""

OK_FORMAT = False
name = "tol-ex-bounds"
points = 3


def test_matches_the_library_and_the_bounds(deterministic_value):
    from fractions import Fraction

    import numpy as np

    import icml26.transductive_online as to

    rng = np.random.default_rng(3)
    for _ in range(25):
        matrix = rng.integers(0, 4, size=(rng.integers(1, 10), rng.integers(1, 6)))
        det = deterministic_value(matrix)
        assert det == to.minimax_mistakes(matrix), matrix
        assert Fraction(det, 2) <= to.randomized_minimax_value(matrix) <= det
    for n in range(1, 7):
        assert deterministic_value(to.all_functions(n).matrix) == n
        assert deterministic_value(to.sparse_multiclass(n, 3).matrix) == 1
