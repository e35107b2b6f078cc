"""Exercise pm-ex-concentration: how much importance the best neurons hold."""

import numpy as np

OK_FORMAT = False
name = "pm-ex-concentration"
points = 1


def test_share_by_brute_force(importance_share, rng):
    for _ in range(20):
        scores = rng.exponential(size=40)
        fraction = rng.choice([0.125, 0.25, 0.375, 0.5, 1.0])
        keep = int(round(fraction * 40))
        want = sorted(scores, reverse=True)[:keep]
        assert abs(importance_share(scores, fraction) - sum(want) / scores.sum()) < 1e-12
    assert importance_share(np.ones(128), 0.375) == 0.375
