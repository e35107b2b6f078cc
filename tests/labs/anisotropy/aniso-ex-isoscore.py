"""Exercise aniso-ex-isoscore: IsoScore, the fraction of dimensions used uniformly."""

import itertools

import numpy as np
from scipy.stats import ortho_group

OK_FORMAT = False
name = "aniso-ex-isoscore"
points = 2


def test_exact_values_on_equal_variance_subspaces(isoscore):
    d = 12
    R = ortho_group.rvs(d, random_state=0)
    for r in (1, 2, 4, 6):
        # every sign pattern on r axes: equal variances, zero covariances, zero mean
        H = np.zeros((2**r, d))
        H[:, :r] = np.array(list(itertools.product([-1.0, 1.0], repeat=r)))
        expected = (r - 1) / (d - 1)
        value = float(isoscore(H @ R))
        assert abs(value - expected) < 1e-9, f"r = {r}: got {value}, expected {expected}"


def test_invariances_and_extremes(isoscore):
    rng = np.random.default_rng(1)
    H = rng.standard_normal((3000, 8)) * np.linspace(0.5, 2.0, 8)
    base = float(isoscore(H))
    assert 0 < base < 1
    assert abs(float(isoscore(4.0 * H)) - base) < 1e-9, "IsoScore should be scale invariant"
    assert abs(float(isoscore(H + 10.0)) - base) < 1e-9, "IsoScore ignores a common mean"
    assert float(isoscore(rng.standard_normal((20000, 8)))) > 0.98
    line = np.outer(rng.standard_normal(500), rng.standard_normal(8))
    assert abs(float(isoscore(line))) < 1e-6, "a line uses one direction: IsoScore 0"
