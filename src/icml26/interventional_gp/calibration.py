r"""Coverage curves, the calibration score, and the bootstrap calibration of $\nu$
(``eq-igp-coverage``, ``eq-igp-score``, ``eq-igp-calibration``).

The calibration never sees the ground truth: it measures how often bootstrap credible intervals
cover the *full-data posterior mean*, and picks the measure scale whose coverage is closest to
nominal across levels (the ``frequentist_calibrate`` procedure of the authors' code).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.stats import norm

from .kernels import data_measure
from .posterior import (
    FusedData,
    GPStage,
    ImpspecPosterior,
    Intervention,
    bayesimp_code_moments,
)

LEVELS = np.linspace(0.0, 1.0, 101)
"""Nominal levels 0, 0.01, ..., 1 of the central credible intervals."""

SCALES = (2.0**-4, 2.0**-2, 1.0, 2.0**2, 2.0**4)
"""Candidate measure scales $\\nu_s$ (the grid of the authors' ablation)."""


def _as_array(values, name: str) -> np.ndarray:
    array = np.asarray(values.detach() if isinstance(values, torch.Tensor) else values, float)
    if not np.isfinite(array).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    return array


def interval_hits(target, mean, sd, levels=LEVELS) -> np.ndarray:
    r"""``(N, L)`` indicators $|t(a) - m(a)| \le z_\ell\, sd(a)$, $z_\ell = \Phi^{-1}((1+\ell)/2)$.
    """
    target, mean, sd = (_as_array(x, name).reshape(-1) for x, name in
                        ((target, "target"), (mean, "mean"), (sd, "sd")))
    if not target.shape == mean.shape == sd.shape:
        raise ValueError(f"shapes differ: {target.shape}, {mean.shape}, {sd.shape}")
    if (sd < 0).any():
        raise ValueError("standard deviations must be non-negative")
    z = norm.ppf((1 + np.asarray(levels, float)) / 2)
    finite = np.isfinite(z)  # level 1 is the whole line, covered even when sd = 0
    widths = sd[:, None] * np.where(finite, z, 0.0)[None, :]
    return (np.abs(target - mean)[:, None] <= widths) | ~finite[None, :]


def coverage_curve(target, mean, sd, levels=LEVELS) -> np.ndarray:
    """Empirical coverage of ``target`` at each nominal level, averaged over points
    (``eq-igp-coverage``)."""
    return interval_hits(target, mean, sd, levels).mean(0)


def calibration_score(coverage, levels=LEVELS) -> float:
    """Mean absolute gap between empirical and nominal coverage over levels (``eq-igp-score``)."""
    coverage = _as_array(coverage, "coverage")
    return float(np.abs(coverage - np.asarray(levels)).mean())


@dataclass(frozen=True)
class CalibrationResult:
    """Chosen scale, the loss of each candidate, and the bootstrap coverage ``(S, N, L)``."""

    scale: float
    scales: tuple[float, ...]
    losses: np.ndarray
    coverage: np.ndarray


def bootstrap_rows(data: FusedData, generator: torch.Generator):
    """Bootstrap row indices of both data sets (the same rows when they are one data set)."""
    n0, n1 = len(data.A), len(data.Y)
    rows0 = torch.randint(0, n0, (n0,), generator=generator)
    rows1 = rows0 if data.paired else torch.randint(0, n1, (n1,), generator=generator)
    return rows0, rows1


def calibrate_measure_scale(data: FusedData, outcome: GPStage, treatment: GPStage,
                            intervention: Intervention, scales=SCALES, n_boot: int = 20,
                            levels=LEVELS, seed: int = 0) -> CalibrationResult:
    r"""Pick $\nu_s$ by bootstrap coverage of the full-data mean (``eq-igp-calibration``).

    For each bootstrap data set $\mathcal D_b$ and candidate scale, the interval
    $m_b(a) \pm z_\ell \sqrt{v_b(a; \nu_s)}$ either covers $\hat\theta(a)$ or not; the loss of a
    scale is the mean over $a$ and $\ell$ of |coverage - $\ell$|. Hyper-parameters stay fixed.
    """
    scales = tuple(float(s) for s in scales)
    if not scales or any(not (np.isfinite(s) and s > 0) for s in scales):
        raise ValueError(f"measure scales must be positive and finite, got {scales}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 1:
        raise ValueError(f"n_boot must be a positive integer, got {n_boot!r}")
    reference = ImpspecPosterior(data, outcome, treatment, intervention).mean
    generator = torch.Generator().manual_seed(seed)
    rows = [bootstrap_rows(data, generator) for _ in range(n_boot)]
    hits = np.zeros((len(scales), len(reference), len(levels)))
    if intervention.columns is None:  # all bootstraps at once (same numbers as the loop below)
        means, variances = bootstrap_moments(data, outcome, treatment, intervention, scales, rows)
        gaps = _as_array(means - reference, "bootstrap means").reshape(n_boot, 1, -1, 1)
        sds = _as_array(variances.sqrt(), "bootstrap sds")[..., None]
        z = norm.ppf((1 + np.asarray(levels, float)) / 2)  # interval_hits, all at once
        finite = np.isfinite(z)
        hits = ((np.abs(gaps) <= sds * np.where(finite, z, 0.0)) | ~finite).mean(0)
    else:
        for rows0, rows1 in rows:
            boot = ImpspecPosterior(data.resample(rows0, rows1), outcome, treatment,
                                    intervention)
            for index, scale in enumerate(scales):
                sd = boot.variance(scale).sqrt()
                hits[index] += interval_hits(reference, boot.mean, sd, levels) / n_boot
    losses = np.abs(hits - np.asarray(levels)).mean(axis=(1, 2))
    return CalibrationResult(scales[int(np.argmin(losses))], scales, losses, hits)


def _batched_gram(X, Y, lengthscale, outputscale):
    """$k(X_b, Y_b)$ for a batch ``(B, n, d)``, ``(B, m, d)`` by one batched matrix product."""
    x, y = X / lengthscale, Y / lengthscale
    square = (x**2).sum(-1)[..., :, None] + (y**2).sum(-1)[..., None, :] - 2 * x @ y.mT
    return outputscale * torch.exp(-0.5 * square.clamp_min(0.0))


def bootstrap_moments(data: FusedData, outcome: GPStage, treatment: GPStage,
                      intervention: Intervention, scales, rows):
    r"""IMPspec means ``(B, N)`` and variances ``(B, S, N)`` on bootstrap data sets, batched.

    The same numbers as :class:`.ImpspecPosterior` on each ``data.resample(*rows[b])`` (to
    rounding), for interventions on every column of $A$: $\beta$, $\kappa$, the mean and
    $V_3$ per bootstrap, then $V_1 + V_2$ per measure scale (``eq-igp-terms``), with every
    bootstrap stacked into one batch of small matrices instead of a Python loop.
    """
    rows0 = torch.stack([r0 for r0, _ in rows])
    rows1 = torch.stack([r1 for _, r1 in rows])
    A, V0, V1, Y = data.A[rows0], data.V0[rows0], data.V1[rows1], data.Y[rows1]
    kA, k = treatment.kernel, outcome.kernel
    values = intervention.values.expand(len(rows), -1, -1)
    eye0 = torch.eye(A.shape[1], dtype=A.dtype)
    eye1 = torch.eye(V1.shape[1], dtype=A.dtype)
    chol_a = torch.linalg.cholesky(_batched_gram(A, A, kA.lengthscale, kA.outputscale)
                                   + treatment.noise * eye0)
    K_qA = _batched_gram(values, A, kA.lengthscale, kA.outputscale)  # (B, N, n0)
    beta = torch.cholesky_solve(K_qA.mT, chol_a)  # (B, n0, N)
    kappa = kA.outputscale - (K_qA * beta.mT).sum(-1)  # diagonal of kappa, (B, N)
    chol = torch.linalg.cholesky(_batched_gram(V1, V1, k.lengthscale, k.outputscale)
                                 + outcome.noise * eye1)
    alpha = torch.cholesky_solve(Y[..., None], chol)  # (B, n1, 1)
    K01 = _batched_gram(V0, V1, k.lengthscale, k.outputscale)
    mean = (beta.mT @ (K01 @ alpha))[..., 0]
    cond00 = (_batched_gram(V0, V0, k.lengthscale, k.outputscale)
              - K01 @ torch.cholesky_solve(K01.mT, chol))
    v3 = (beta * (cond00 @ beta)).sum(-2)  # diagonal of beta^T C beta, (B, N)
    centre, spread_v = V1.mean(-2, keepdim=True), V1.std(-2, keepdim=True).clamp_min(1e-12)
    ell2 = k.lengthscale**2
    variances = []
    for scale in scales:
        var = (float(scale) * spread_v) ** 2
        spread = ell2 + 2 * var
        a, b = (1 / ell2 + 1 / spread) / 4, (1 / ell2 - 1 / spread) / 4
        x = V1 - centre
        exponent = ((x**2 * a).sum(-1)[..., :, None] + (x**2 * a).sum(-1)[..., None, :]
                    - 2 * (x * b) @ x.mT)
        factor = torch.sqrt(ell2 / spread).prod(-1)[..., None]  # (B, 1, 1)
        R = k.outputscale**2 * factor * torch.exp(-exponent)
        norm = (alpha.mT @ R @ alpha)[..., 0, 0]
        residual = k.outputscale - torch.diagonal(torch.cholesky_solve(R, chol), dim1=-2,
                                                  dim2=-1).sum(-1)
        variances.append((kappa * (norm + residual)[:, None] + v3).clamp_min(0.0))
    return mean, torch.stack(variances, 1)


VALID_SCALE = 6.0**-0.5
"""Measure scales at or below $1/\\sqrt 6$ leave the range where the spectral representation
holds; the grid without them is the valid grid."""


def valid_choice(result: CalibrationResult, lower: float = VALID_SCALE) -> float:
    """The scale the same bootstrap picks when the grid keeps only scales above ``lower``."""
    keep = [i for i, s in enumerate(result.scales) if s > lower]
    if not keep:
        raise ValueError(f"no scale of {result.scales} lies above {lower}")
    return result.scales[min(keep, key=lambda i: result.losses[i])]


def calibrate_bayesimp_scale(data: FusedData, outcome: GPStage, treatment: GPStage,
                             intervention: Intervention, scales=SCALES, n_boot: int = 20,
                             levels=LEVELS, seed: int = 0,
                             weights: str = "nuclear") -> CalibrationResult:
    r"""The bootstrap of :func:`calibrate_measure_scale` for BayesIMP (``eq-igp-calibration``).

    BayesIMP's measure enters its prior $r$ and so its mean too: for each scale the target is the
    full-data BayesIMP mean at that scale, and the bootstrap intervals are those of the variance
    formula ``weights`` (``"nuclear"``: the authors' current formula, weights $\alpha_r$) on the
    same bootstrap rows as IMPspec's (same ``seed``). Hyper-parameters stay fixed.
    """
    scales = tuple(float(s) for s in scales)
    if not scales or any(not (np.isfinite(s) and s > 0) for s in scales):
        raise ValueError(f"measure scales must be positive and finite, got {scales}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 1:
        raise ValueError(f"n_boot must be a positive integer, got {n_boot!r}")
    references = [bayesimp_code_moments(data, outcome, treatment, intervention,
                                         data_measure(data.V1, s), weights=weights).mean
                  for s in scales]
    generator = torch.Generator().manual_seed(seed)
    hits = np.zeros((len(scales), len(references[0]), len(levels)))
    for _ in range(n_boot):
        boot = data.resample(*bootstrap_rows(data, generator))
        for index, scale in enumerate(scales):
            moments = bayesimp_code_moments(boot, outcome, treatment, intervention,
                                            data_measure(boot.V1, scale), weights=weights)
            hits[index] += interval_hits(references[index], moments.mean,
                                         moments.variance.sqrt(), levels) / n_boot
    losses = np.abs(hits - np.asarray(levels)).mean(axis=(1, 2))
    return CalibrationResult(scales[int(np.argmin(losses))], scales, losses, hits)
