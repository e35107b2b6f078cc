r"""The sampling-GP baseline: a GP per column of $V \mid A$, pushed through GP draws of $f$.

For each of $S$ draws: sample the mean functions $g(a)$ of $V \mid A$ from their posterior on the
grid, draw $M$ values $V_m(a) = g(a) + \sigma\epsilon_m$, sample $f$ jointly at all of them from
its posterior, and average: $\theta_s(a) = \frac1M \sum_m f_s(V_m(a))$. The mean and
variance of $\theta_s$ over draws are the baseline's moments; the finite $M$ adds Monte Carlo
variance of order $\operatorname{Var}[f(V)] / M$.
"""

from __future__ import annotations

import torch

from .kernels import DTYPE
from .posterior import FusedData, GPStage, Intervention, outcome_posterior, treatment_weights
from .training import fit_treatment_stage


def fit_sampling_stage(data: FusedData, max_iter: int = 100) -> GPStage:
    """One GP per column of $V_0$ with shared hyper-parameters: Eq. (18) with $G = V_0V_0^\\top$."""
    return fit_treatment_stage(data.A, data.V0 @ data.V0.T, float(data.V0.shape[1]), max_iter)


def sampling_gp_moments(data: FusedData, outcome: GPStage, stage: GPStage,
                        intervention: Intervention, n_draws: int = 50, n_inner: int = 10,
                        seed: int = 0):
    """Mean and variance ``(N,)`` of the sampling-GP estimate of $\\theta$ (module docstring)."""
    if intervention.columns is not None:
        raise ValueError("the sampling baseline supports interventions on every column of A")
    if n_draws < 2 or n_inner < 1:
        raise ValueError(f"need n_draws >= 2 and n_inner >= 1, got {n_draws}, {n_inner}")
    generator = torch.Generator().manual_seed(seed)
    beta, kappa = treatment_weights(data, stage, intervention)
    mean_v = beta.T @ data.V0  # (N, d)
    grid_chol = torch.linalg.cholesky(kappa + 1e-8 * torch.eye(len(kappa), dtype=DTYPE))
    N, d = mean_v.shape
    draws = torch.empty(n_draws, N, dtype=DTYPE)
    for s in range(n_draws):
        g = mean_v + grid_chol @ torch.randn(N, d, dtype=DTYPE, generator=generator)
        noise = torch.randn(N, n_inner, d, dtype=DTYPE, generator=generator)
        V = (g[:, None, :] + stage.noise**0.5 * noise).reshape(N * n_inner, d)
        f_mean, f_cov = outcome_posterior(data.V1, data.Y, outcome, V)
        f_chol = torch.linalg.cholesky(f_cov + 1e-8 * torch.eye(len(V), dtype=DTYPE))
        f = f_mean + f_chol @ torch.randn(len(V), dtype=DTYPE, generator=generator)
        draws[s] = f.reshape(N, n_inner).mean(1)
    return draws.mean(0), draws.var(0)
