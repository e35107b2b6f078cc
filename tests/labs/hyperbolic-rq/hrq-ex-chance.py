"""Exercise hrq-ex-chance: the collision rate of uniformly random tuples."""

import numpy as np

OK_FORMAT = False
name = "hrq-ex-chance"
points = 1


def test_expected_collision_of_random_tuples(random_collision_rate):
    rng = np.random.default_rng(0)
    for n, sizes in ((200, (4, 4)), (500, (8, 4, 2)), (50, (100,))):
        m = int(np.prod(sizes))
        sim = np.mean([1 - len(np.unique(rng.integers(0, m, n))) / n for _ in range(400)])
        assert abs(random_collision_rate(n, sizes) - sim) < 0.01, (n, sizes)
    assert random_collision_rate(1, (4, 4)) == 0.0
