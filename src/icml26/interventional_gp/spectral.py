r"""A finite spectral basis of $k_V$ in $L^2(\nu)$, and Monte Carlo draws of $\theta$ from it.

The Nyström method turns $P$ draws $U \sim \nu$ into eigenpairs: if
$K_{UU}/P = \Phi\Lambda\Phi^\top$, then $e_j(v) = k(v, U)\phi_j / (\sqrt P \lambda_j)$ is
orthonormal in the empirical $L^2(\nu)$ and
$k(v, v') \approx \sum_{j \le J} \lambda_j e_j(v) e_j(v')$ (``eq-igp-mercer``). With $J$
coordinates the
interventional process is a finite Bayesian model that can be sampled directly, which checks the
closed-form moments of ``eq-igp-terms`` without using them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .kernels import DTYPE, GaussianKernel, GaussianMeasure
from .posterior import FusedData, GPStage, Intervention, treatment_weights


@dataclass(frozen=True)
class SpectralBasis:
    """Eigenvalues ``(J,)`` of $k$ in $L^2(\\nu)$ and the Nyström eigenfunctions."""

    kernel: GaussianKernel
    points: torch.Tensor
    eigenvalues: torch.Tensor
    vectors: torch.Tensor

    def __call__(self, X) -> torch.Tensor:
        """$e_j(x)$ for every row of ``X`` and every $j$: an ``(n, J)`` matrix."""
        P = len(self.points)
        return self.kernel.gram(X, self.points) @ self.vectors / (P**0.5 * self.eigenvalues)


def nystrom_basis(kernel: GaussianKernel, measure: GaussianMeasure, n_points: int = 2000,
                  n_features: int = 300, seed: int = 0) -> SpectralBasis:
    """The top ``n_features`` Nyström eigenpairs of ``kernel`` from ``n_points`` draws of $\\nu$.

    Eigenvalues below ``1e-12`` times the largest are round-off and are dropped.
    """
    if not 1 <= n_features <= n_points:
        raise ValueError(f"need 1 <= n_features <= n_points, got {n_features}, {n_points}")
    U = measure.sample(n_points, torch.Generator().manual_seed(seed))
    values, vectors = torch.linalg.eigh(kernel.gram(U) / n_points)
    order = torch.argsort(values, descending=True)[:n_features]
    # Eigenpairs below round-off (relative 1e-12) carry no information: drop them.
    order = order[values[order] > 1e-12 * values.max()]
    return SpectralBasis(kernel, U, values[order], vectors[:, order])


def spectral_draws(data: FusedData, outcome: GPStage, treatment: GPStage,
                   intervention: Intervention, basis: SpectralBasis, n_samples: int = 20000,
                   prior_power: int = 1, seed: int = 0) -> torch.Tensor:
    r"""Draws ``(n_samples, N)`` of $\theta(a) = \sum_j f_j u_j(a)$ in the finite basis.

    $f_j$ have prior variances $\lambda_j^{p}$ ($p = 1$: IMPspec, $f \sim \mathcal{GP}(0, k)$;
    $p = 2$: BayesIMP, $f \sim \mathcal{GP}(0, r)$), and their joint posterior given $Y$ is
    Gaussian; the $u_j(a)$ are independent with mean $\beta(a)^\top e_j(V_0)$ and variance
    $\kappa(a, a)$.
    """
    if prior_power not in (1, 2):
        raise ValueError(f"prior_power must be 1 (IMPspec) or 2 (BayesIMP), got {prior_power}")
    generator = torch.Generator().manual_seed(seed)
    prior_sd = basis.eigenvalues ** (prior_power / 2)
    E1, E0 = basis(data.V1), basis(data.V0)
    # Whitened coordinates g = f / prior_sd have a well-conditioned posterior precision.
    features = E1 * prior_sd
    precision = torch.eye(len(prior_sd), dtype=DTYPE) + features.T @ features / outcome.noise
    chol = torch.linalg.cholesky(precision)
    g_mean = torch.cholesky_solve((features.T @ data.Y / outcome.noise)[:, None], chol)[:, 0]
    # g = mean + L^{-T} z has covariance (L L^T)^{-1}, the posterior covariance.
    z = torch.randn(len(prior_sd), n_samples, dtype=DTYPE, generator=generator)
    f = prior_sd * (g_mean + torch.linalg.solve_triangular(chol.T, z, upper=True).T)  # (S, J)
    beta, kappa = treatment_weights(data, treatment, intervention)
    u_mean = beta.T @ E0  # (N, J)
    u_sd = torch.diagonal(kappa).clamp_min(0).sqrt()
    draws = torch.empty(n_samples, len(u_mean), dtype=DTYPE)
    for a in range(len(u_mean)):
        u = u_mean[a] + u_sd[a] * torch.randn(n_samples, len(prior_sd), dtype=DTYPE,
                                               generator=generator)
        draws[:, a] = (f * u).sum(1)
    return draws


def gaussian_mercer_eigenvalues(n: int, lengthscale: float, outputscale: float,
                                measure_sd: float) -> torch.Tensor:
    r"""The first ``n`` Mercer eigenvalues of a 1-D Gaussian kernel in
    $L^2(\mathcal N(0, \sigma^2))$.

    With $\rho = 1/4\sigma^2$, $\omega = 1/2\ell^2$ and
    $h = \rho + \omega + \sqrt{\rho^2 + 2\rho\omega}$,
    $\lambda_j = s^2 \sqrt{2\rho/h}\,(\omega/h)^{j}$ for $j = 0, 1, \dots$ (Rasmussen and Williams,
    2006, section 4.3.1; the eigenfunctions are Hermite functions). They decay geometrically, and
    sum to $\tau = s^2$ (``eq-igp-mercer``).
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    for name, value in (("lengthscale", lengthscale), ("outputscale", outputscale),
                        ("measure_sd", measure_sd)):
        if not (isinstance(value, (int, float)) and value > 0 and value < float("inf")):
            raise ValueError(f"{name} must be positive and finite, got {value!r}")
    rho, omega = 1 / (4 * measure_sd**2), 1 / (2 * lengthscale**2)
    h = rho + omega + (rho**2 + 2 * rho * omega) ** 0.5
    j = torch.arange(n, dtype=DTYPE)
    return outputscale * (2 * rho / h) ** 0.5 * (omega / h) ** j
