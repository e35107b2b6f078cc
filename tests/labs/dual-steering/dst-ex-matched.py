"""Exercise dst-ex-matched: a matched probe value is a matched behaviour only for parallel pairs."""

import numpy as np

from icml26 import dual_steering as ds

OK_FORMAT = False
name = "dst-ex-matched"
points = 3


def test_gap_vanishes_for_parallel_pairs_only(ratio_gap_at_matched_probe):
    rng = np.random.default_rng(7)
    base, target = np.arange(6), np.arange(6, 12)
    G = rng.standard_normal((18, 4))
    G_par = ds.pair_spread_head(G, base, target, 0.0)
    delta = ds.pair_direction(G_par, base, target)
    lam0 = rng.standard_normal(4) - 2 * delta / np.linalg.norm(delta)
    assert abs(ratio_gap_at_matched_probe(G_par, lam0, delta, base, target)) < 1e-6
    w = delta + 1.5 * rng.standard_normal(4)
    G_spread = ds.pair_spread_head(G, base, target, 2.0)
    gap = ratio_gap_at_matched_probe(G_spread, lam0, w, base, target)
    assert abs(gap) > 1e-3
