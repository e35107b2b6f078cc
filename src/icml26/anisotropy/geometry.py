r"""The curvature-visibility toy model: a curved 1-D manifold sampled in a small patch.

Points $x(s) = (s, \tfrac{\kappa}{2} s^2)$ with $s \sim \mathcal N(0, \sigma^2)$ lie on a parabola
of curvature $\kappa$ at the origin. The tangent coordinate has variance $\sigma^2$ and the normal
coordinate $\tfrac{\kappa^2}{4}\operatorname{Var}(s^2) = \tfrac{\kappa^2}{2}\sigma^4$, so the
cloud looks flat, and anisotropic along the tangent, when the sampling mass is concentrated
(`eq-curvature`).
"""

from __future__ import annotations

import numbers

import numpy as np

from icml26.core import check_positive


def parabola_sample(curvature: float, spread: float, count: int,
                    rng: np.random.Generator) -> np.ndarray:
    r"""``count`` points $(s, \tfrac{\kappa}{2} s^2)$ with $s \sim \mathcal N(0, \sigma^2)$."""
    curvature = check_positive(curvature, "curvature")
    spread = check_positive(spread, "spread")
    if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 2:
        raise ValueError(f"count must be an integer >= 2, got {count!r}")
    s = spread * rng.standard_normal(int(count))
    return np.column_stack([s, 0.5 * curvature * s**2])


def visible_curvature_ratio(curvature: float, spread: float) -> float:
    r"""Normal over tangent variance of the parabola sample: $\kappa^2 \sigma^2 / 2$
    (`eq-curvature`)."""
    curvature = check_positive(curvature, "curvature")
    spread = check_positive(spread, "spread")
    return 0.5 * curvature**2 * spread**2
