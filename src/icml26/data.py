r"""Synthetic two-sample problems for the MOD chapter.

`X` is always $n$ draws from $\mathcal N(0, I_d)$. `Y` is $m$ draws from a distribution picked by
`kind`, with one knob `theta`:

* `null`: $\mathcal N(0, I_d)$ (`theta` ignored);
* `scale`: $\mathcal N(0, \theta^2 I_d)$, scale $\theta > 0$;
* `corr`: $\mathcal N(0, (1-\rho) I_d + \rho \mathbf 1 \mathbf 1^\top)$, $\rho = \theta \in [0, 1)$;
* `location`: $\mathcal N(\delta, I_d)$ with $\delta = (\theta / \sqrt d)\mathbf 1$, so
  $\|\delta\| = \theta \ge 0$;
* `mixture`: $\tfrac12 \mathcal N(0, I_d) + \tfrac12 \mathcal N(\theta u, I_d)$ with
  $u = \mathbf 1 / \sqrt d$ and $\theta \ge 0$.

`corr` keeps unit variances, so the trace of the covariance is unchanged: a covariance shift that
a pure "spread" detector cannot see. `mixture` moves half of `Y` by `theta` along the unit
diagonal, which changes both the mean (by `theta / 2`) and the shape.
"""

import numbers

import numpy as np

from icml26.core import check_count

KINDS = ("null", "scale", "corr", "location", "mixture")


def check_theta(kind: str, theta) -> float:
    """The alternative's parameter must be finite and inside the range of its `kind`."""
    if isinstance(theta, bool) or not isinstance(theta, numbers.Real):
        raise TypeError(f"theta must be a real number, got {type(theta).__name__}")
    theta = float(theta)
    if not np.isfinite(theta):
        raise ValueError(f"theta must be finite, got {theta}")
    if kind == "scale" and theta <= 0:
        raise ValueError(f"scale shift needs theta > 0, got {theta}")
    if kind == "corr" and not 0 <= theta < 1:
        raise ValueError(f"equicorrelation needs 0 <= theta < 1, got {theta}")
    if kind in ("location", "mixture") and theta < 0:
        raise ValueError(f"{kind} shift needs theta >= 0, got {theta}")
    return theta


def equicorrelated_normal(rng: np.random.Generator, m: int, d: int, rho: float) -> np.ndarray:
    r"""$\sqrt{1-\rho}\,\varepsilon + \sqrt{\rho}\, w \mathbf 1$: unit variance, correlation $\rho$.

    One shared factor $w$ per point makes every pair of coordinates correlated.
    """
    own_noise = rng.standard_normal((m, d))
    shared_factor = rng.standard_normal((m, 1))
    return np.sqrt(1 - rho) * own_noise + np.sqrt(rho) * shared_factor


def diagonal_direction(d: int) -> np.ndarray:
    r"""Unit vector $\mathbf 1 / \sqrt d$: a shift spread evenly over all coordinates."""
    return np.full(d, 1 / np.sqrt(d))


def sample_y(rng: np.random.Generator, kind: str, m: int, d: int, theta: float) -> np.ndarray:
    """Draw the second sample for the chosen alternative (see the module table)."""
    if kind == "corr":
        return equicorrelated_normal(rng, m, d, theta)
    noise = rng.standard_normal((m, d))
    if kind == "scale":
        return theta * noise
    if kind == "location":
        return noise + theta * diagonal_direction(d)
    if kind == "mixture":
        shifted = rng.random(m) < 0.5
        return noise + np.outer(shifted, theta * diagonal_direction(d))
    return noise


def two_sample(
    kind: str, n: int, m: int, d: int, theta: float = 0.0, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Return float64 arrays `X` of shape `(n, d)` and `Y` of shape `(m, d)`.

    The same `seed` always gives the same arrays (one `numpy.random.Generator` per call).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; choose from {KINDS}")
    n, m = check_count(n, "n", 2), check_count(m, "m", 2)
    d = check_count(d, "d", 1)
    seed = check_count(seed, "seed", 0)
    theta = check_theta(kind, theta)
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    Y = sample_y(rng, kind, m, d, theta)
    return X, Y
