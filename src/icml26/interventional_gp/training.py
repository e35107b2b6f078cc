r"""Hyper-parameter learning for the two stages (chapter ``eq-igp-ml-y``, ``eq-igp-ml-a``).

* $Y \mid V$: the exact GP marginal likelihood, with gpytorch's ``ExactGP``;
* $V \mid A$: the eigenvalue-weighted sum of the marginal likelihoods of the spectral
  coordinates, $-\tfrac{\tau}{2}\log|K_A + \sigma_A^2 I| - \tfrac12\operatorname{tr}[(K_A +
  \sigma_A^2 I)^{-1} G]$ with $G = K_{00}$ (``eq-igp-ml-a``);
* BayesIMP: the marginal likelihood of $Y$ under the nuclear-dominant kernel $r$.

All three use L-BFGS with a strong Wolfe line search on log-parameters.
"""

from __future__ import annotations

import math

import gpytorch
import torch

from .kernels import (
    DTYPE,
    GaussianKernel,
    as_matrix,
    data_measure,
    integral_operator_tensor,
    median_lengthscales,
    scaled_square_distance,
    stable_cholesky,
)
from .posterior import GPStage

NOISE_FLOOR = 1e-6


class OutcomeGP(gpytorch.models.ExactGP):
    """Zero-mean GP with a scaled ARD RBF kernel: the $Y \\mid V$ stage in gpytorch."""

    def __init__(self, V: torch.Tensor, Y: torch.Tensor, likelihood):
        super().__init__(V, Y, likelihood)
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(
            gpytorch.kernels.RBFKernel(ard_num_dims=V.shape[1]))

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def outcome_gpytorch_model(V, Y, stage: GPStage | None = None):
    """A float64 ``OutcomeGP`` (and its likelihood), set to ``stage``'s hyper-parameters."""
    V = as_matrix(V, "V", 2)
    Y = as_matrix(Y, "Y", 2)[:, 0]
    likelihood = gpytorch.likelihoods.GaussianLikelihood(
        noise_constraint=gpytorch.constraints.GreaterThan(NOISE_FLOOR)).double()
    model = OutcomeGP(V, Y, likelihood).double()
    if stage is not None:
        model.covar_module.base_kernel.lengthscale = stage.kernel.lengthscale[None, :]
        model.covar_module.outputscale = stage.kernel.outputscale
        likelihood.noise = stage.noise
    return model, likelihood


def _lbfgs(parameters, loss_fn, max_iter: int) -> None:
    """Minimise ``loss_fn()`` over ``parameters`` with L-BFGS and a strong Wolfe line search."""
    if max_iter < 1:
        raise ValueError(f"max_iter must be positive, got {max_iter}")
    optimizer = torch.optim.LBFGS(parameters, lr=1.0, max_iter=max_iter,
                                  line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = loss_fn()
        loss.backward()
        return loss

    optimizer.step(closure)


def fit_outcome_stage(V, Y, max_iter: int = 100) -> GPStage:
    """Learn $(\\ell_V, s_V^2, \\sigma_y^2)$ by exact marginal likelihood in gpytorch
    (``eq-igp-ml-y``).

    Starts from the per-dimension median lengthscale, $s_V^2 = \\operatorname{Var}(Y)$ and
    $\\sigma_y^2 = 0.2\\operatorname{Var}(Y)$.
    """
    V = as_matrix(V, "V", 2)
    Y = as_matrix(Y, "Y", 2)[:, 0]
    if len(V) != len(Y):
        raise ValueError(f"V has {len(V)} rows and Y {len(Y)}")
    var_y = float(Y.var())
    start = GPStage(GaussianKernel(median_lengthscales(V), var_y), 0.2 * var_y)
    model, likelihood = outcome_gpytorch_model(V, Y, start)
    model.train()
    likelihood.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    _lbfgs(list(model.parameters()), lambda: -mll(model(V), Y), max_iter)
    return GPStage(
        GaussianKernel(model.covar_module.base_kernel.lengthscale.detach()[0],
                       float(model.covar_module.outputscale.detach())),
        float(likelihood.noise.detach()))


def treatment_objective(A, target_gram, trace, log_lengthscale, log_outputscale, log_noise):
    r"""``eq-igp-ml-a``:
    $-\tfrac{\tau}{2}\log|K_A + \sigma_A^2 I| - \tfrac12\operatorname{tr}[(K_A +
    \sigma_A^2 I)^{-1} G]$, averaged over the $n_0$ rows."""
    K = torch.exp(log_outputscale) * _unit_gram(A, torch.exp(log_lengthscale))
    K = K + (torch.exp(log_noise) + NOISE_FLOOR) * torch.eye(len(A), dtype=DTYPE)
    chol = stable_cholesky(K)
    logdet = 2 * torch.log(torch.diagonal(chol)).sum()
    fit = torch.trace(torch.cholesky_solve(target_gram, chol))
    return -(trace * logdet + fit) / (2 * len(A))


def _log_parameter(value: float) -> torch.Tensor:
    """A trainable scalar holding ``log(value)``."""
    return torch.tensor(math.log(value), dtype=DTYPE, requires_grad=True)


def _unit_gram(X, lengthscale):
    return torch.exp(-0.5 * scaled_square_distance(X, X, lengthscale))


def fit_treatment_stage(A, target_gram, trace: float, max_iter: int = 100) -> GPStage:
    """Learn $(\\ell_A, s_A^2, \\sigma_A^2)$ by maximising ``eq-igp-ml-a``.

    ``target_gram`` is $G = K_{00} = k_V(V_0, V_0)$ and ``trace`` is $\\tau$ for IMPspec; for a
    GP on each column of $V$ (the sampling baseline) they are $V_0 V_0^\\top$ and $d$.
    """
    A = as_matrix(A, "A", 2)
    target_gram = torch.as_tensor(target_gram, dtype=DTYPE).detach()
    if target_gram.shape != (len(A), len(A)):
        raise ValueError(f"target gram must be {len(A)} x {len(A)}, got {target_gram.shape}")
    if not trace > 0:
        raise ValueError(f"trace must be positive, got {trace}")
    scale0 = float(torch.diagonal(target_gram).mean()) / trace  # the level of G's diagonal
    params = [torch.log(median_lengthscales(A)).requires_grad_(True),
              _log_parameter(scale0), _log_parameter(0.1 * scale0)]
    _lbfgs(params, lambda: -treatment_objective(A, target_gram, trace, *params), max_iter)
    log_ell, log_scale, log_noise = (p.detach() for p in params)
    return GPStage(GaussianKernel(torch.exp(log_ell), float(torch.exp(log_scale))),
                   float(torch.exp(log_noise)) + NOISE_FLOOR)


def bayesimp_log_likelihood(V, Y, log_lengthscale, log_outputscale, log_noise, log_scale):
    """Log marginal likelihood of $Y$ under $r$; the measure sd is ``exp(log_scale) sd(V)``."""
    sd = torch.exp(log_scale) * V.std(0)
    R = integral_operator_tensor(V, V, torch.exp(log_lengthscale), torch.exp(log_outputscale),
                                 V.mean(0), sd)
    K = R + (torch.exp(log_noise) + NOISE_FLOOR) * torch.eye(len(V), dtype=DTYPE)
    chol = stable_cholesky(K)
    alpha = torch.cholesky_solve(Y[:, None], chol)
    return -0.5 * (Y[:, None] * alpha).sum() - torch.log(torch.diagonal(chol)).sum()


def fit_bayesimp_outcome(V, Y, max_iter: int = 100, measure_scale: float = 1.0) -> GPStage:
    """Learn BayesIMP's $(\\ell_V, s_V^2, \\sigma_y^2)$ by marginal likelihood under $r$.

    The measure scale stays fixed (at 1 by default, as in the authors' baseline). The returned
    stage holds the base kernel $k$ from which $r$ is built.
    """
    V = as_matrix(V, "V", 2)
    Y = as_matrix(Y, "Y", 2)[:, 0]
    data_measure(V, measure_scale)  # validates the scale
    var_y = float(Y.var())
    log_scale = torch.tensor(math.log(measure_scale), dtype=DTYPE)
    params = [torch.log(median_lengthscales(V)).requires_grad_(True),
              _log_parameter(var_y**0.5),  # r(v, v) is about s^4, so s^2 starts at sd(Y)
              _log_parameter(0.2 * var_y)]
    _lbfgs(params, lambda: -bayesimp_log_likelihood(V, Y, *params, log_scale) / len(V),
           max_iter)
    log_ell, log_s2, log_noise = (p.detach() for p in params)
    return GPStage(GaussianKernel(torch.exp(log_ell), float(torch.exp(log_s2))),
                   float(torch.exp(log_noise)) + NOISE_FLOOR)
