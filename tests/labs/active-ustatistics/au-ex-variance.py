"""Exercise au-ex-variance: the standard error of the AIPW U-statistic, by hand."""

import numpy as np

from icml26 import active_ustatistics as au

OK_FORMAT = False
name = "au-ex-variance"
points = 3


def test_matches_the_library(aipw_std_error, rng):
    for n in (30, 55):
        y = rng.exponential(size=n)
        y_hat = y + 0.4 * rng.standard_normal(n)
        pi = rng.uniform(0.1, 1, n)
        sampled = rng.uniform(size=n) < pi
        labels = np.where(sampled, y, np.nan)
        by_hand = aipw_std_error(labels, y_hat, pi, sampled, lambda u, v: abs(u - v))
        library = au.aipw_ustatistic(labels, y_hat, pi, sampled, au.gini_kernel).std_error
        assert abs(by_hand - library) <= 1e-10 * library, f"n={n}: {by_hand} != {library}"
