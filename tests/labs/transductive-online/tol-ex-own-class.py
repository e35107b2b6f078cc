"""Exercise tol-ex-own-class: the class of intervals, projected and measured."""

import itertools
from fractions import Fraction

import icml26.transductive_online as to

OK_FORMAT = False
name = "tol-ex-own-class"
points = 3


def test_intervals_class(intervals, submission, rng):
    points = [float(x) for x in rng.choice([0.1, 0.3, 0.5, 0.7, 0.9], size=6)]
    points[-1] = points[0]  # a repeated point
    matrix = submission.evaluate("intervals(points).matrix", points=points)
    pairs = itertools.combinations_with_replacement(sorted(set(points)), 2)
    direct = to.project([lambda x: 0] + [lambda x, a=a, b=b: int(a <= x <= b) for a, b in pairs],
                        points)
    rows = {tuple(int(v) for v in r) for r in matrix}
    assert rows == {tuple(r) for r in direct.matrix}, "not the class of intervals"
    distinct = len(set(points))
    assert len(rows) == distinct * (distinct + 1) // 2 + 1
    on_eight = to.finite_class(submission.evaluate("intervals(range(8)).matrix"), range(8))
    assert to.level_constrained_dimension(on_eight)[0] == 2
    assert to.lcll_depth(on_eight, 3) == 2


def test_interval_values(interval_values):
    assert [det for _, det, _ in interval_values] == [1, 2, 4, 6, 8, 10]
    assert all(Fraction(det, 2) <= ran <= det for _, det, ran in interval_values)
