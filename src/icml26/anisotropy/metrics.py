r"""Anisotropy measures of a point cloud $H \in \mathbb R^{N \times d}$ (one row per token).

Equation numbers refer to the anisotropy chapter of the book. Every function accepts a NumPy
array or a torch tensor, works in float64 and rejects bad input (fewer than two vectors, NaNs,
wrong shapes) with a ``ValueError`` or ``TypeError``.

* :func:`mean_cosine`: the mean pairwise cosine similarity over pairs $i \neq j$ (`eq-mean-cosine`).
* :func:`top_share`: the share of the second moment in the top $k$ directions (`eq-top-share`).
* :func:`effective_rank`: Roy and Vetterli's entropy-effective rank (`eq-effective-rank`).
* :func:`partition_isotropy`: Mu and Viswanath's partition-function isotropy score
  (`eq-partition`).
* :func:`collision_probability`: $e^{-H_2(q)}$, the probability that two draws coincide
  (`eq-collision`).
"""

from __future__ import annotations

import numbers

import numpy as np
import torch
from scipy.special import logsumexp


def as_points(H, name: str = "H") -> np.ndarray:
    """``H`` as a finite float64 array of shape ``(N, d)`` with ``N >= 2`` and ``d >= 1``."""
    if torch.is_tensor(H):
        H = H.detach().cpu().double().numpy()
    if not isinstance(H, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array or torch tensor, got {type(H).__name__}")
    if H.dtype == bool or not (np.issubdtype(H.dtype, np.floating)
                               or np.issubdtype(H.dtype, np.integer)):
        raise TypeError(f"{name} must hold real numbers, got dtype {H.dtype}")
    if H.ndim != 2:
        raise ValueError(f"{name} must have shape (N, d), got shape {H.shape}")
    if H.shape[0] < 2 or H.shape[1] < 1:
        raise ValueError(f"{name} needs at least two vectors of dimension >= 1, got {H.shape}")
    H = H.astype(np.float64)
    if not np.isfinite(H).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    return H


def _check_rank(k, d: int) -> int:
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"k must be an integer, got {type(k).__name__}")
    if not 1 <= k <= d:
        raise ValueError(f"k must lie in [1, {d}], got {k}")
    return int(k)


def mean_cosine(H) -> float:
    r"""Mean cosine similarity over all ordered pairs $i \neq j$ of rows of ``H``
    (`eq-mean-cosine`).

    With unit rows $u_i$ and $s = \sum_i u_i$, `eq-cosine-sum` gives
    $\sum_{i \neq j} u_i^\top u_j = \lVert s\rVert^2 - N$, so the average costs $O(Nd)$.
    """
    H = as_points(H)
    norms = np.linalg.norm(H, axis=1)
    if (norms == 0).any():
        raise ValueError("cosine similarity is undefined for zero vectors")
    total = (H / norms[:, None]).sum(axis=0)
    count = H.shape[0]
    return float((total @ total - count) / (count * (count - 1)))


def spectrum(H, centre: bool = False) -> np.ndarray:
    r"""Eigenvalues, largest first, of $\frac1N H^\top H$ (raw) or of the covariance
    (`eq-moment-split`).

    The uncentred second moment sees the common mean direction (the "cone"); the covariance sees
    only how the points spread around their mean.
    """
    H = as_points(H)
    if centre:
        H = H - H.mean(axis=0)
    singular = np.linalg.svd(H, compute_uv=False)
    eigenvalues = np.zeros(H.shape[1])
    eigenvalues[:singular.size] = singular**2 / H.shape[0]
    return eigenvalues


def top_share(H, k: int = 1, centre: bool = False) -> float:
    r"""Share $\sum_{i \le k} \lambda_i / \sum_i \lambda_i$ of the top $k$ eigenvalues
    (`eq-top-share`)."""
    eigenvalues = spectrum(H, centre)
    k = _check_rank(k, eigenvalues.size)
    total = eigenvalues.sum()
    if total == 0:
        raise ValueError("the points have no spread (all eigenvalues are zero)")
    return float(eigenvalues[:k].sum() / total)


def effective_rank(H, centre: bool = False) -> float:
    r"""Roy and Vetterli's effective rank $\exp(-\sum_i p_i \log p_i)$, $p_i \propto \sigma_i$.

    `eq-effective-rank`: $\sigma_i$ are the singular values of ``H`` (centred first if
    ``centre``). It lies in $[1, \min(N, d)]$, equals $r$ for $r$
    equal singular values and is scale and rotation invariant.
    """
    sigma = np.sqrt(spectrum(H, centre))
    if sigma.sum() == 0:
        raise ValueError("the points have no spread (all singular values are zero)")
    p = sigma[sigma > 0] / sigma.sum()
    return float(np.exp(-(p * np.log(p)).sum()))


def partition_isotropy(H, normalise: bool = True) -> float:
    r"""Mu and Viswanath's isotropy $\min_c Z(c) / \max_c Z(c)$ (`eq-partition`).

    $Z(c) = \sum_i e^{c^\top h_i}$.

    The unit vectors $c$ range over $\pm$ the eigenvectors of $H^\top H$ (both signs, so the score
    does not depend on the arbitrary sign a solver gives an eigenvector). 1 means isotropic. $Z$
    depends on the length of the vectors, so by default ``H`` is first divided by its root mean
    square row norm, which makes the score scale invariant (our choice); ``normalise=False``
    gives the score on the raw vectors.
    """
    H = as_points(H)
    if normalise:
        rms = np.sqrt((H**2).sum(axis=1).mean())
        if rms == 0:
            raise ValueError("cannot normalise: every vector is zero")
        H = H / rms
    _, vectors = np.linalg.eigh(H.T @ H)
    directions = np.concatenate([vectors, -vectors], axis=1)
    log_z = logsumexp(H @ directions, axis=0)
    return float(np.exp(log_z.min() - log_z.max()))


def all_metrics(H) -> dict[str, float]:
    """Every measure of this module, raw and (where it differs) centred, in one dictionary."""
    H = as_points(H)
    centred = H - H.mean(axis=0)
    return {
        "mean_cosine": mean_cosine(H),
        "mean_cosine_centred": mean_cosine(centred),
        "top1_share": top_share(H, 1),
        "top1_share_centred": top_share(H, 1, centre=True),
        "effective_rank": effective_rank(H),
        "effective_rank_centred": effective_rank(H, centre=True),
        "partition_isotropy": partition_isotropy(H),
    }


def cone_cosine(mean, covariance_trace: float) -> float:
    r"""High-dimensional limit of the mean cosine of $\mu + \varepsilon$ (`eq-cone`).

    $\lVert\mu\rVert^2 / (\lVert\mu\rVert^2 + \operatorname{tr} C)$ for noise of covariance $C$.
    """
    mean = np.asarray(mean, dtype=np.float64)
    if mean.ndim != 1 or not np.isfinite(mean).all():
        raise ValueError("mean must be a finite vector")
    if not np.isfinite(covariance_trace) or covariance_trace < 0:
        raise ValueError(f"the covariance trace must be finite and >= 0, got {covariance_trace}")
    energy = float(mean @ mean)
    if energy + covariance_trace == 0:
        raise ValueError("zero mean and zero covariance: every vector is zero")
    return energy / (energy + covariance_trace)


def as_distribution(q, name: str = "q") -> np.ndarray:
    """``q`` as a 1-D float64 probability vector (non-negative, summing to 1)."""
    q = np.asarray(q, dtype=np.float64)
    if q.ndim != 1 or q.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D probability vector, got shape {q.shape}")
    if not np.isfinite(q).all() or (q < 0).any() or abs(q.sum() - 1) > 1e-8:
        raise ValueError(f"{name} must be non-negative and sum to 1")
    return q


def shannon_entropy(q) -> float:
    r"""$H(q) = -\sum_v q_v \log q_v$ in nats."""
    q = as_distribution(q)
    q = q[q > 0]
    return float(-(q * np.log(q)).sum())


def collision_probability(q) -> float:
    r"""$\sum_v q_v^2 = e^{-H_2(q)}$: the chance that two independent draws agree
    (`eq-collision`)."""
    q = as_distribution(q)
    return float(q @ q)


def rank_correlation_test(x, y) -> tuple[float, float]:
    r"""Spearman's $\rho$ of ``x`` and ``y`` and its exact one-sided permutation p-value.

    The p-value is the fraction of the $n!$ orderings of ``y`` whose $\rho$ is at least the
    observed one (ties counted), the exact null distribution when the pairs are exchangeable.
    Suited to a handful of points, where a normal approximation fails: with five points a
    perfect ordering has $p = 1/120$. Needs $3 \le n \le 8$.
    """
    from itertools import permutations

    from scipy.stats import rankdata

    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape or not 3 <= x.size <= 8:
        raise ValueError(f"x and y must be 1-D of equal length in [3, 8], got {x.shape}, {y.shape}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("x and y must be finite")
    rx, ry = rankdata(x), rankdata(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    scale = np.sqrt((rx**2).sum() * (ry**2).sum())
    if scale == 0:
        raise ValueError("x or y is constant")
    observed = float(rx @ ry / scale)
    null = np.array([rx @ ry[list(order)] for order in permutations(range(x.size))]) / scale
    return observed, float((null >= observed - 1e-12).mean())


def _centred_ranks(values: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    ranks = rankdata(values)
    return ranks - ranks.mean()


def stratified_rank_test(x, y, strata, permutations: int = 20_000,
                         seed: int = 0) -> tuple[float, float]:
    r"""Mean Spearman's $\rho$ of ``x`` and ``y`` within strata (seeds) and its one-sided
    permutation p-value, ``y`` permuted independently within each stratum.

    The statistic is the average over strata of the within-stratum $\rho$; the null shuffles the
    pairing inside every stratum, so differences between strata (a seed that is anisotropic
    overall) cannot create a trend. The p-value counts the observed statistic as one draw,
    $(1 + \#\{\bar\rho^* \ge \bar\rho\}) / (1 + B)$, so it is never 0.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    strata = np.asarray(strata)
    if x.ndim != 1 or x.shape != y.shape or strata.shape != x.shape:
        raise ValueError("x, y and strata must be 1-D of equal length")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("x and y must be finite")
    if isinstance(permutations, bool) or not isinstance(permutations, numbers.Integral) \
            or permutations < 1:
        raise ValueError(f"permutations must be a positive integer, got {permutations!r}")
    rng = np.random.default_rng(seed)
    observed, null = 0.0, np.zeros(permutations)
    labels = np.unique(strata)
    for label in labels:
        inside = strata == label
        if inside.sum() < 3:
            raise ValueError("every stratum needs at least 3 points")
        rx, ry = _centred_ranks(x[inside]), _centred_ranks(y[inside])
        scale = np.sqrt((rx**2).sum() * (ry**2).sum())
        if scale == 0:
            raise ValueError("x or y is constant within a stratum")
        observed += rx @ ry / scale
        shuffled = rng.permuted(np.tile(ry, (permutations, 1)), axis=1)
        null += shuffled @ rx / scale
    observed, null = observed / len(labels), null / len(labels)
    return float(observed), float((1 + (null >= observed - 1e-12).sum()) / (1 + permutations))
