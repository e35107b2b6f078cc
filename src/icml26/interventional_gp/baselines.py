r"""The sampling-GP baseline: a GP per column of $V \mid A$, pushed through GP draws of $f$.

For each of $S$ draws and each intervention $a$: sample the mean $g(a)$ of $V \mid A = a$ from
its posterior, draw $M$ values $V_m(a) = g(a) + \sigma\epsilon_m$, sample $f$ jointly at those
$M$ points from its posterior, and average: $\theta_s(a) = \frac1M \sum_m f_s(V_m(a))$. The mean
and variance of $\theta_s(a)$ over the $S$ draws are the baseline's moments. Only these marginal
moments are used, so each intervention is sampled on its own (as the authors' code does), which
costs $O(S N (M n_1 d + M^2 n_1 + M^3))$ instead of $O(S (NM)^3)$ for a draw joint over the grid.

The finite $M$ adds Monte Carlo variance: by the law of total variance,
$\operatorname{Var}\theta_s(a) = \operatorname{Var}\theta_\infty(a)
+ E[\operatorname{Var}(f(V) \mid g, f)] / M$ (``eq-igp-inner-draws`` in the chapter), where
$\theta_\infty(a) = E[f(V) \mid g(a), f]$. :func:`sampling_gp_inner_sweep` draws $M_{\max}$
values per intervention once and averages the first $M$ of them for every requested $M$, so
the sweep is paired (common random numbers) and costs one run at $M_{\max}$.
"""

from __future__ import annotations

import torch

from .kernels import DTYPE
from .posterior import FusedData, GPStage, Intervention, treatment_weights
from .training import fit_treatment_stage

JITTER = 1e-8
"""Relative jitter added to the posterior covariance of $f$ before each Cholesky factor."""


def fit_sampling_stage(data: FusedData, max_iter: int = 100) -> GPStage:
    """One GP per column of $V_0$ with shared hyper-parameters: ``eq-igp-ml-a`` with
    $G = V_0V_0^\\top$."""
    return fit_treatment_stage(data.A, data.V0 @ data.V0.T, float(data.V0.shape[1]), max_iter)


def _gram(X, Z_scaled, lengthscale, outputscale):
    r"""$s^2\exp(-\tfrac12\|(x - z)/\ell\|^2)$ for (batches of) points, by exact distances.

    Not :func:`.kernels.unit_gaussian_gram`, which works on one pair of matrices and centres
    them; here ``torch.cdist`` takes the batches of draws directly (no gradient is needed).
    """
    distance = torch.cdist(X / lengthscale, Z_scaled, compute_mode="donot_use_mm_for_euclid_dist")
    return outputscale * torch.exp(-0.5 * distance.pow(2))


def _check_inner(inner) -> tuple[int, ...]:
    inner = tuple(inner)
    if not inner or any(isinstance(m, bool) or not isinstance(m, int) or m < 1 for m in inner):
        raise ValueError(f"inner draw counts must be positive integers, got {inner}")
    return inner


def sampling_gp_inner_sweep(data: FusedData, outcome: GPStage, stage: GPStage,
                            intervention: Intervention, n_draws: int = 50, inner=(1, 10, 100),
                            seed: int = 0, within: bool = False):
    r"""Moments of the sampling-GP estimate for several inner draw counts $M$ (module docstring).

    Returns ``{M: (mean, variance)}`` with tensors of shape ``(N,)``. With ``within=True`` it also
    returns, under the key ``"within"``, the mean over draws of the sample variance of the
    $M_{\max}$ values $f_s(V_m(a))$: an unbiased estimate of $E[\operatorname{Var}(f(V) \mid g,
    f)]$, the numerator of the $1/M$ term of ``eq-igp-inner-draws``.
    """
    if intervention.columns is not None:
        raise ValueError("the sampling baseline supports interventions on every column of A")
    inner = _check_inner(inner)
    if isinstance(n_draws, bool) or not isinstance(n_draws, int) or n_draws < 2:
        raise ValueError(f"need an integer n_draws >= 2, got {n_draws!r}")
    if within and max(inner) < 2:
        raise ValueError("the within-draw variance needs at least 2 inner draws")
    generator = torch.Generator().manual_seed(seed)
    beta, kappa = treatment_weights(data, stage, intervention)
    mean_v = beta.T @ data.V0  # (N, d)
    sd_g = torch.diagonal(kappa).clamp_min(0).sqrt()[:, None]  # (N, 1)
    N, d = mean_v.shape
    M = max(inner)
    kernel, V1 = outcome.kernel, data.V1
    V1_scaled = V1 / kernel.lengthscale
    ell, s2 = kernel.lengthscale, kernel.outputscale
    chol11 = torch.linalg.cholesky(kernel.gram(V1)
                                   + outcome.noise * torch.eye(len(V1), dtype=DTYPE))
    alpha = torch.cholesky_solve(data.Y[:, None], chol11)[:, 0]
    jitter = JITTER * s2 * torch.eye(M, dtype=DTYPE)
    draws = {m: torch.empty(n_draws, N, dtype=DTYPE) for m in inner}
    spread = torch.zeros(N, dtype=DTYPE)
    for s in range(n_draws):
        g = mean_v + sd_g * torch.randn(N, d, dtype=DTYPE, generator=generator)
        noise = torch.randn(N, M, d, dtype=DTYPE, generator=generator)
        V = g[:, None, :] + stage.noise**0.5 * noise  # (N, M, d)
        K_v1 = _gram(V.reshape(N * M, d), V1_scaled, ell, s2)  # (NM, n1)
        f_mean = (K_v1 @ alpha).reshape(N, M)
        W = torch.linalg.solve_triangular(chol11, K_v1.T, upper=False)  # (n1, NM)
        W = W.T.reshape(N, M, -1)
        K_vv = _gram(V, V / ell, ell, s2)  # (N, M, M)
        cov = K_vv - W @ W.transpose(1, 2)
        chol, info = torch.linalg.cholesky_ex(0.5 * (cov + cov.transpose(1, 2)) + jitter)
        if info.any():
            raise RuntimeError("posterior covariance of f is not positive definite; "
                               "raise JITTER")
        z = torch.randn(N, M, 1, dtype=DTYPE, generator=generator)
        f = f_mean + (chol @ z)[..., 0]  # (N, M)
        for m in inner:
            draws[m][s] = f[:, :m].mean(1)
        if within:
            spread += f.var(1) / n_draws
    moments = {m: (values.mean(0), values.var(0)) for m, values in draws.items()}
    if within:
        moments["within"] = spread
    return moments


def sampling_gp_moments(data: FusedData, outcome: GPStage, stage: GPStage,
                        intervention: Intervention, n_draws: int = 50, n_inner: int = 10,
                        seed: int = 0):
    """Mean and variance ``(N,)`` of the sampling-GP estimate of $\\theta$ with $M$ =
    ``n_inner``."""
    if isinstance(n_inner, bool) or not isinstance(n_inner, int) or n_inner < 1:
        raise ValueError(f"need an integer n_inner >= 1, got {n_inner!r}")
    return sampling_gp_inner_sweep(data, outcome, stage, intervention, n_draws, (n_inner,),
                                   seed)[n_inner]
