r"""The sampling-GP baseline: a GP per column of $V \mid A$, pushed through GP draws of $f$.

For each of $S$ draws and each intervention $a$: sample the mean $g(a)$ of $V \mid A = a$ from
its posterior, draw $M$ values $V_m(a) = g(a) + \sigma\epsilon_m$, sample $f$ jointly at those
$M$ points from its posterior, and average: $\theta_s(a) = \frac1M \sum_m f_s(V_m(a))$. The mean
and variance of $\theta_s(a)$ over the $S$ draws are the baseline's moments. Only these marginal
moments are used, so each intervention is sampled on its own (as the authors' code does). Given
$g$ and the $V_m$ the average is Gaussian, so it is drawn from that law directly (the same law
as averaging a joint draw of $f$), which costs $O(S N (M n_1 d + M^2 d))$ instead of
$O(S N (M^2 n_1 + M^3))$ for the joint draw of $f$, or $O(S (NM)^3)$ for a draw joint over the
grid.

The finite $M$ adds Monte Carlo variance: by the law of total variance,
$\operatorname{Var}\theta_s(a) = \operatorname{Var}\theta_\infty(a)
+ E[\operatorname{Var}(f(V) \mid g, f)] / M$ (``eq-igp-inner-draws`` in the chapter), where
$\theta_\infty(a) = E[f(V) \mid g(a), f]$. :func:`sampling_gp_inner_sweep` draws $M_{\max}$
values per intervention once and averages the first $M$ of them for every requested $M$ (the
averages drawn jointly), so the sweep is paired (common random numbers) and costs one run at
$M_{\max}$.
"""

from __future__ import annotations

import torch

from ..core import one_thread
from .kernels import DTYPE
from .posterior import FusedData, GPStage, Intervention, treatment_weights
from .training import fit_treatment_stage

JITTER = 1e-8
"""Relative jitter added to the covariance of the averages before each Cholesky factor."""
WITHIN_DRAWS = 10
"""Outer draws over which the within-draw variance is averaged (its closed form costs
$O(N M n_1^2)$ per draw, the largest term; it is unbiased from any number of draws)."""


def fit_sampling_stage(data: FusedData, max_iter: int = 100) -> GPStage:
    """One GP per column of $V_0$ with shared hyper-parameters: ``eq-igp-ml-a`` with
    $G = V_0V_0^\\top$."""
    return fit_treatment_stage(data.A, data.V0 @ data.V0.T, float(data.V0.shape[1]), max_iter)


def _gram(X, Z_scaled, lengthscale, outputscale):
    r"""$s^2\exp(-\tfrac12\|(x - z)/\ell\|^2)$ for (batches of) points.

    Not :func:`.kernels.unit_gaussian_gram`, which works on one pair of matrices and centres
    them; here the batches of draws go in directly (no gradient is needed). Squared distances by
    $\|x\|^2 + \|z\|^2 - 2x^\top z$ (one batched matrix product; in float64 the cancellation
    error is about $10^{-15}$ of the squared norms, far below the jitter).
    """
    X = X / lengthscale
    square = ((X * X).sum(-1)[..., :, None] + (Z_scaled * Z_scaled).sum(-1)[..., None, :]
              - 2 * X @ Z_scaled.transpose(-1, -2))
    return outputscale * torch.exp(-0.5 * square.clamp_min(0))


def _check_inner(inner) -> tuple[int, ...]:
    inner = tuple(inner)
    if not inner or any(isinstance(m, bool) or not isinstance(m, int) or m < 1 for m in inner):
        raise ValueError(f"inner draw counts must be positive integers, got {inner}")
    return inner


def sampling_gp_inner_sweep(data: FusedData, outcome: GPStage, stage: GPStage,
                            intervention: Intervention, n_draws: int = 50, inner=(1, 10, 100),
                            seed: int = 0, within: bool = False,
                            within_draws: int = WITHIN_DRAWS):
    r"""Moments of the sampling-GP estimate for several inner draw counts $M$ (module docstring).

    Returns ``{M: (mean, variance)}`` with tensors of shape ``(N,)``. With ``within=True`` it also
    returns, under the key ``"within"``, the expected sample variance of the $M_{\max}$ values
    $f_s(V_m(a))$ given each draw of $g$ and the $V_m$ (closed form), averaged over the first
    ``within_draws`` outer draws: an unbiased estimate of $E[\operatorname{Var}(f(V) \mid g,
    f)]$, the numerator of the $1/M$ term of ``eq-igp-inner-draws``.

    Given $g$ and the $V_m$, the averages $\theta^{(M)} = \frac1M\sum_{m \le M} f(V_m)$ for
    all requested $M$ are jointly Gaussian (mean and covariance from the posterior of $f$ at the
    $V_m$), so they are drawn from that $k$-variate law ($k$ the number of requested $M$)
    instead of drawing $f$ at all $M_{\max}$ points: the same joint law of the averages as
    the joint draw of $f$, at $O(N M n_1 + N M^2)$ instead of $O(N (M^2 n_1 + M^3))$ per draw.
    """
    with one_thread():  # many small operations: a second thread only adds synchronisation
        return _inner_sweep(data, outcome, stage, intervention, n_draws, inner, seed, within,
                            within_draws)


def _inner_sweep(data, outcome, stage, intervention, n_draws, inner, seed, within,
                 within_draws):
    if intervention.columns is not None:
        raise ValueError("the sampling baseline supports interventions on every column of A")
    inner = tuple(sorted(set(_check_inner(inner))))  # the last column averages all M points
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
    n1 = len(V1)
    chol11 = torch.linalg.cholesky(kernel.gram(V1)
                                   + outcome.noise * torch.eye(n1, dtype=DTYPE))
    alpha = torch.cholesky_solve(data.Y[:, None], chol11)[:, 0]
    inverse11 = torch.cholesky_inverse(chol11) if within else None
    # averaging weights: column j averages the first inner[j] of the M points
    P = torch.zeros(M, len(inner), dtype=DTYPE)
    for j, m in enumerate(inner):
        P[:m, j] = 1.0 / m
    jitter = JITTER * s2 * torch.eye(len(inner), dtype=DTYPE)
    draws = torch.empty(n_draws, N, len(inner), dtype=DTYPE)
    spread = torch.zeros(N, dtype=DTYPE)
    for s in range(n_draws):
        g = mean_v + sd_g * torch.randn(N, d, dtype=DTYPE, generator=generator)
        noise = torch.randn(N, M, d, dtype=DTYPE, generator=generator)
        V = g[:, None, :] + stage.noise**0.5 * noise  # (N, M, d)
        K_v1 = _gram(V.reshape(N * M, d), V1_scaled, ell, s2)  # (NM, n1)
        f_mean = (K_v1 @ alpha).reshape(N, M)
        # the averages theta = P^T f given (g, V): Gaussian, mean P^T f_mean and covariance
        # P^T (K_vv - K_v1 K_11^{-1} K_1v) P, so only the (N, n1, k) products P^T K_v1 are solved
        K_v1 = K_v1.reshape(N, M, n1)
        WP = torch.linalg.solve_triangular(
            chol11, torch.einsum("nmi,mk->ink", K_v1, P).reshape(n1, -1), upper=False)
        WP = WP.reshape(n1, N, -1).permute(1, 0, 2)  # (N, n1, k)
        K_vv = _gram(V, V / ell, ell, s2)  # (N, M, M)
        cov = P.T @ K_vv @ P - WP.transpose(1, 2) @ WP  # (N, k, k)
        chol, info = torch.linalg.cholesky_ex(0.5 * (cov + cov.transpose(1, 2)) + jitter)
        if info.any():
            raise RuntimeError("posterior covariance of the averages is not positive definite; "
                               "raise JITTER")
        z = torch.randn(N, len(inner), 1, dtype=DTYPE, generator=generator)
        draws[s] = f_mean @ P + (chol @ z)[..., 0]
        if within and s < within_draws:
            # E[sample variance of f(V_1..V_M) | g, V], in closed form: the spread of the
            # posterior means plus (tr cov - 1^T cov 1 / M) / (M - 1)
            K_v1 = K_v1.reshape(N * M, n1)
            trace = M * s2 - ((K_v1 @ inverse11) * K_v1).sum(1).reshape(N, M).sum(1)
            spread += f_mean.var(1) + (trace - M * cov[:, -1, -1]) / (M - 1)
    draws = {m: draws[..., j] for j, m in enumerate(inner)}
    moments = {m: (values.mean(0), values.var(0)) for m, values in draws.items()}
    if within:
        moments["within"] = spread / min(n_draws, within_draws)
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
