r"""Sampling rules under a label budget: uniform, the water-filling optimum and the practical rule.

All rules return inclusion probabilities $\pi_i \in (0, 1]$ with $\sum_i \pi_i = B$, the expected
number of labels (Poisson sampling). Chapter equations: ``eq-optimal-rule`` (water filling) and
``eq-practical-rule`` (plug-in uncertainty mixed with the uniform rule).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable

import numpy as np

from .estimators import Kernel, as_records


def check_budget(budget, n: int) -> float:
    """The expected number of labels must be a real number in (0, n]."""
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        raise TypeError(f"budget must be a real number, got {type(budget).__name__}")
    if not 0 < budget <= n:
        raise ValueError(f"budget must be in (0, n] = (0, {n}], got {budget}")
    return float(budget)


def uniform_inclusion(n: int, budget) -> np.ndarray:
    r"""$\pi_i = B / n$ for every unit: the non-active (prediction-powered) design."""
    return np.full(n, check_budget(budget, n) / n)


def water_filling(scores, budget) -> np.ndarray:
    r"""$\pi_i = \min(1, c\, s_i)$, $c$ such that $\sum_i \pi_i = B$ (Eq. ``eq-optimal-rule``).

    ``scores`` are $s_i \ge 0$, ideally $\sqrt{e(X_i)}$. Units are capped at 1 from the largest
    score down; $c$ then spreads the remaining budget over the others in proportion to $s_i$.
    Units with score zero get probability zero, so mix with :func:`mix_with_uniform` before use.
    """
    scores = np.asarray(scores, dtype=float)
    if scores.ndim != 1 or not np.all(np.isfinite(scores)) or np.any(scores < 0):
        raise ValueError("scores must be a 1-D array of finite, non-negative numbers")
    n = len(scores)
    budget = check_budget(budget, n)
    positive = int(np.count_nonzero(scores))
    if positive <= budget:
        return (scores > 0).astype(float)
    descending = np.sort(scores)[::-1]
    tail_sums = np.cumsum(descending[::-1])[::-1]  # sum of descending[k:]
    for capped in range(int(budget) + 1):
        scale = (budget - capped) / tail_sums[capped]
        if scale * descending[capped] <= 1:
            return np.minimum(1.0, scale * scores)
    raise AssertionError("water filling found no level; scores or budget are inconsistent")


def mix_with_uniform(pi, budget, tau: float) -> np.ndarray:
    r"""$(1 - \tau)\pi + \tau B / n$: same budget, and a floor $\tau B / n$ under every unit."""
    pi = np.asarray(pi, dtype=float)
    if not 0 <= tau <= 1:
        raise ValueError(f"tau must be in [0, 1], got {tau}")
    return (1 - tau) * pi + tau * uniform_inclusion(len(pi), budget)


def practical_inclusion(uncertainty, budget, tau: float = 0.2) -> np.ndarray:
    """Eq. ``eq-practical-rule``: water filling on a fitted uncertainty, mixed with uniform."""
    uncertainty = np.clip(np.asarray(uncertainty, dtype=float), 0, None)
    return mix_with_uniform(water_filling(uncertainty, budget), budget, tau)


def poisson_sample(pi, uniforms) -> np.ndarray:
    r"""$\xi_i = \mathbb 1[U_i < \pi_i]$: independent Bernoulli($\pi_i$) draws from given uniforms.

    Passing the uniforms (rather than a generator) lets several designs share them, which makes
    their comparison sharper (common random numbers).
    """
    pi, uniforms = np.asarray(pi, float), np.asarray(uniforms, float)
    if pi.shape != uniforms.shape:
        raise ValueError(f"pi {pi.shape} and uniforms {uniforms.shape} differ in shape")
    return uniforms < pi


def plugin_projection(kernel: Kernel, reference) -> Callable[[np.ndarray], np.ndarray]:
    r"""$\hat g(z) = \frac1m \sum_j h(z, z_j)$ over reference records (Eq. ``eq-projection``)."""
    reference = as_records(reference, "reference")

    def projection(records) -> np.ndarray:
        records = as_records(records)
        return kernel(records[:, None, :], reference[None, :, :]).mean(axis=1)

    return projection
