"""Exercise tol-ex-own-class: the class of intervals, projected and measured."""

OK_FORMAT = False
name = "tol-ex-own-class"
points = 3


def test_intervals_class(intervals, interval_values):
    import itertools
    from fractions import Fraction

    import icml26.transductive_online as to

    points = [0.3, 0.1, 0.7, 0.3, 0.5]  # a repeated point
    cls = intervals(points)
    pairs = itertools.combinations_with_replacement(sorted(set(points)), 2)
    direct = to.project([lambda x: 0] + [lambda x, a=a, b=b: int(a <= x <= b) for a, b in pairs],
                        points)
    rows = {tuple(r) for r in cls.matrix}
    assert rows == {tuple(r) for r in direct.matrix}, "not the class of intervals"
    assert len(rows) == 4 * 5 // 2 + 1
    on_eight = intervals(range(8))
    assert to.level_constrained_dimension(on_eight)[0] == 2
    assert to.lcll_depth(on_eight, 3) == 2
    assert [det for _, det, _ in interval_values] == [1, 2, 4, 6, 8, 10]
    assert all(Fraction(det, 2) <= ran <= det for _, det, ran in interval_values)
