r"""Order-2 U-statistics with actively sampled labels: the AIPW estimator and its baselines.

Every unit $i$ has a *record* (a row of floats): its label $Y_i$, possibly with covariates that
are always observed (Kendall's $\tau$ pairs a covariate with the label). A kernel ``h(u, v)``
acts on the last axis of two record arrays and broadcasts over the leading axes, so the same
function gives one value, a diagonal or a whole kernel matrix.

Chapter equations: the AIPW U-statistic (Eq. ``eq-aipw``), its atom form (``eq-atoms``) and the
variance estimate (``eq-variance-estimate``) of the ``active-ustatistics`` chapter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import stats

Kernel = Callable[[np.ndarray, np.ndarray], np.ndarray]
CHUNK_ENTRIES = 2**21  # kernel-matrix entries evaluated at once (about 16 MB of float64)


def gini_kernel(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    r"""$h(y, y') = |y - y'|$: its U-statistic is the Gini mean difference (Eq. ``eq-gini``)."""
    return np.abs(u[..., 0] - v[..., 0])


def kendall_kernel(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    r"""Kendall's $\tau_a$ kernel on records $(a, y)$.

    $h = \operatorname{sign}(a - a')\operatorname{sign}(y - y')$.
    """
    return np.sign((u[..., 0] - v[..., 0]) * (u[..., 1] - v[..., 1]))  # one sign: faster


def mean_kernel(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    r"""$h(y, y') = (y + y')/2$: its U-statistic is the sample mean (Eq. ``eq-mean-reduction``)."""
    return (u[..., 0] + v[..., 0]) / 2


def as_records(values, name: str = "records") -> np.ndarray:
    """A float array of shape (n, k): one row per unit; a 1-D array becomes one column."""
    array = np.asarray(values, dtype=float)
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim != 2 or array.shape[0] < 2:
        raise ValueError(f"{name} must be 1-D or 2-D with at least 2 units, got {array.shape}")
    return array


def kendall_records(covariate, labels) -> np.ndarray:
    """Records (a_i, y_i) for :func:`kendall_kernel`; labels may hold NaN for unsampled units."""
    covariate, labels = np.asarray(covariate, float), np.asarray(labels, float)
    if covariate.shape != labels.shape or covariate.ndim != 1:
        raise ValueError(f"covariate {covariate.shape} and labels {labels.shape} must be equal 1-D")
    return np.column_stack([covariate, labels])


@dataclass(frozen=True)
class UStatEstimate:
    """A point estimate with its standard error and the number of labels it used."""

    estimate: float
    std_error: float
    n_labels: int

    def interval(self, level: float = 0.9) -> tuple[float, float]:
        """Normal confidence interval (Eq. ``eq-interval``)."""
        if not 0 < level < 1:
            raise ValueError(f"level must be in (0, 1), got {level}")
        half = stats.norm.ppf(0.5 + level / 2) * self.std_error
        return self.estimate - half, self.estimate + half

    def covers(self, target: float, level: float = 0.9) -> bool:
        low, high = self.interval(level)
        return bool(low <= target <= high)


def check_inclusion(pi, n: int) -> np.ndarray:
    """Inclusion probabilities must be n finite values in (0, 1]."""
    pi = np.asarray(pi, dtype=float)
    if pi.shape != (n,):
        raise ValueError(f"inclusion probabilities must have shape ({n},), got {pi.shape}")
    if not np.all((pi > 0) & (pi <= 1)):
        raise ValueError("inclusion probabilities must lie in (0, 1]; "
                         f"got min {np.nanmin(pi):.3g}, max {np.nanmax(pi):.3g}")
    return pi


def check_sampled(sampled, labels: np.ndarray) -> np.ndarray:
    """A boolean mask of the labelled units, whose labels must all be known."""
    sampled = np.asarray(sampled)
    if sampled.shape != labels.shape[:1]:
        raise ValueError(f"sampled mask must have shape ({labels.shape[0]},), got {sampled.shape}")
    if sampled.dtype != bool:
        raise TypeError(f"sampled must be a boolean mask, got dtype {sampled.dtype}")
    if np.isnan(labels[sampled]).any():
        raise ValueError("labels of sampled units contain NaN; every queried label must be known")
    return sampled


def ipw_weights(pi: np.ndarray, sampled: np.ndarray) -> np.ndarray:
    r"""$w_i = \xi_i / \pi_i$ (Eq. ``eq-weights``)."""
    return np.where(sampled, 1.0 / pi, 0.0)


def kernel_matvec(left: np.ndarray, right: np.ndarray, weights: np.ndarray,
                  kernel: Kernel) -> np.ndarray:
    r"""$K w$ with $K_{ab} = h(\mathrm{left}_a, \mathrm{right}_b)$, in chunks to bound memory."""
    out = np.empty(len(left))
    step = max(1, CHUNK_ENTRIES // max(1, len(right)))
    for start in range(0, len(left), step):
        block = kernel(left[start:start + step, None, :], right[None, :, :])
        out[start:start + step] = block @ weights
    return out


def prediction_row_sums(predictions, kernel: Kernel) -> np.ndarray:
    r"""$P_i = \sum_j h(\hat Z_i, \hat Z_j)$ (all $j$): the only $O(n^2)$ part of Eq. ``eq-atoms``.

    It involves no label and no inclusion probability, so designs compared on the same
    population can share it (pass it to :func:`aipw_ustatistic`).
    """
    predictions = as_records(predictions, "predictions")
    if kernel is gini_kernel:  # sum_j |a - b_j| has a closed form through the order statistics
        return gini_row_sums(predictions[:, 0], predictions[:, 0])
    if kernel is mean_kernel:  # sum_j (a + b_j) / 2 = (n a + sum_j b_j) / 2
        values = predictions[:, 0]
        return (len(values) * values + values.sum()) / 2
    return kernel_matvec(predictions, predictions, np.ones(len(predictions)), kernel)


def gini_row_sums(points: np.ndarray, reference: np.ndarray) -> np.ndarray:
    r"""$\sum_k |p_i - r_k|$ for every point, in $O((n + m) \log m)$ by sorting the reference."""
    ordered = np.sort(reference)
    prefix = np.concatenate([[0.0], np.cumsum(ordered)])
    below = np.searchsorted(ordered, points)
    above_sum = prefix[-1] - prefix[below]
    return below * points - prefix[below] + above_sum - (len(ordered) - below) * points


def own_unit_block(atoms, masses, owners, n, kernel) -> np.ndarray:
    """Sum over pairs of atoms of the same unit (a unit has at most two atoms)."""
    block = np.bincount(owners, weights=masses**2 * kernel(atoms, atoms), minlength=n)
    order = np.argsort(owners, kind="stable")
    same = owners[order][1:] == owners[order][:-1]
    first, second = order[:-1][same], order[1:][same]
    cross = 2 * masses[first] * masses[second] * kernel(atoms[first], atoms[second])
    return block + np.bincount(owners[first], weights=cross, minlength=n)


def estimate_from_row_sums(row_sums: np.ndarray, n_labels: int) -> UStatEstimate:
    r"""$\hat\theta = \sum_i r_i / (n(n-1))$ and $\widehat{\mathrm{se}}^2 = 4 s^2_{\hat\psi} / n$.

    Eqs. ``eq-aipw`` and ``eq-variance-estimate``, with $\hat\psi_i = r_i / (n - 1)$.
    """
    n = len(row_sums)
    psi = row_sums / (n - 1)
    return UStatEstimate(float(psi.mean()), float(np.sqrt(4 * psi.var(ddof=1) / n)), n_labels)


def aipw_ustatistic(labels, predictions, pi, sampled, kernel: Kernel,
                    prediction_sums=None) -> UStatEstimate:
    r"""The AIPW U-statistic of order 2 (Eq. ``eq-aipw``) with its standard error.

    ``labels`` are the unit records with true labels (NaN allowed where not sampled),
    ``predictions`` the same records with predicted labels, ``pi`` the inclusion probabilities
    and ``sampled`` the Poisson draw $\xi$. Unit $i$ contributes the signed measure
    $(1 - w_i)\delta_{\hat Y_i} + w_i \delta_{Y_i}$. Cost: $O(n^2)$ for
    :func:`prediction_row_sums` (skipped when ``prediction_sums`` is given), then
    $O(n\, n_{lab})$.
    """
    labels, predictions = as_records(labels, "labels"), as_records(predictions, "predictions")
    if labels.shape != predictions.shape:
        raise ValueError(f"labels {labels.shape} and predictions {predictions.shape} differ")
    if np.isnan(predictions).any():
        raise ValueError("predictions contain NaN")
    n = len(labels)
    pi = check_inclusion(pi, n)
    sampled = check_sampled(sampled, labels)
    w = ipw_weights(pi, sampled)
    if prediction_sums is None:
        prediction_sums = prediction_row_sums(predictions, kernel)
    elif np.shape(prediction_sums) != (n,):
        raise ValueError(f"prediction_sums must have shape ({n},)")
    labelled = np.flatnonzero(sampled)
    # Atoms: every prediction (mass 1 - w_i) and every queried label (mass w_i). The masses are
    # 1 on the predictions plus a correction that lives on the labelled units only.
    atoms = np.vstack([predictions, labels[labelled]])
    masses = np.concatenate([1 - w, w[labelled]])
    owners = np.concatenate([np.arange(n), labelled])
    correction_atoms = np.vstack([predictions[labelled], labels[labelled]])
    correction = np.concatenate([-w[labelled], w[labelled]])
    to_predictions = np.concatenate([
        prediction_sums,
        kernel_matvec(labels[labelled], predictions, np.ones(n), kernel),
    ])
    kernel_times_mass = to_predictions + kernel_matvec(atoms, correction_atoms, correction, kernel)
    with_self = np.bincount(owners, weights=masses * kernel_times_mass, minlength=n)
    row_sums = with_self - own_unit_block(atoms, masses, owners, n, kernel)
    return estimate_from_row_sums(row_sums, int(sampled.sum()))


def full_ustatistic(records, kernel: Kernel) -> UStatEstimate:
    """The ordinary U-statistic of all units (Eq. ``eq-ustat``), with its standard error."""
    records = as_records(records)
    if np.isnan(records).any():
        raise ValueError("records contain NaN")
    n = len(records)
    ones, units = np.ones(n), np.arange(n)
    row_sums = kernel_matvec(records, records, ones, kernel) - own_unit_block(
        records, ones, units, n, kernel)
    return estimate_from_row_sums(row_sums, n)


def classical_ustatistic(labels, sampled, kernel: Kernel) -> UStatEstimate:
    """Baseline: the ordinary U-statistic of the labelled units only, ignoring predictions."""
    labels = as_records(labels, "labels")
    sampled = check_sampled(sampled, labels)
    if sampled.sum() < 3:
        raise ValueError(f"the classical estimator needs at least 3 labels, got {sampled.sum()}")
    return full_ustatistic(labels[sampled], kernel)


def gini_mean_difference(values) -> float:
    r"""Exact $\binom n2^{-1}\sum_{i<j}|y_i - y_j|$ in $O(n \log n)$ via the order statistics."""
    y = np.sort(np.asarray(values, dtype=float))
    n = len(y)
    if n < 2 or np.isnan(y).any():
        raise ValueError("need at least 2 values and no NaN")
    ranks = np.arange(1, n + 1)
    return float(2 * np.sum((2 * ranks - n - 1) * y) / (n * (n - 1)))


def kendall_tau_a(covariate, labels) -> float:
    r"""Kendall's $\tau_a$ (the U-statistic of :func:`kendall_kernel`) in $O(n \log n)$.

    ``scipy.stats.kendalltau`` returns $\tau_b$; its tie corrections are undone here, so the
    result equals $(n_c - n_d) / \binom n2$ with or without ties.
    """
    a, y = np.asarray(covariate, float), np.asarray(labels, float)
    if a.shape != y.shape or a.ndim != 1 or len(a) < 2:
        raise ValueError("covariate and labels must be equal-length 1-D arrays of 2+ values")
    pairs = len(a) * (len(a) - 1) / 2
    tau_b = stats.kendalltau(a, y).statistic
    return float(tau_b * np.sqrt((pairs - tied_pairs(a)) * (pairs - tied_pairs(y))) / pairs)


def tied_pairs(values: np.ndarray) -> float:
    """Number of pairs with equal values."""
    counts = np.unique(values, return_counts=True)[1]
    return float(np.sum(counts * (counts - 1) / 2))
