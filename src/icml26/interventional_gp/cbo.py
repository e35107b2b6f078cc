r"""Causal Bayesian optimisation on a grid with expected improvement (``eq-igp-causal-prior``,
``eq-igp-ei``).

The surrogate for $a \mapsto \theta(a)$ is a GP whose prior is either the *causal prior*, mean
$m(a) = E[\theta(a) \mid \mathcal D]$ and kernel $\sigma(a)\sigma(a') + k(a, a')$ with
$\sigma^2(a) = \operatorname{Var}[\theta(a) \mid \mathcal D]$ (Aglietti et al., 2020), or the
zero-mean GP with kernel $k$. Each query reveals the true interventional value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import norm


def expected_improvement(mean, sd, best: float) -> np.ndarray:
    r"""$E[\max(\theta - \theta^*, 0)] = (m - \theta^*)\Phi(z) + s\,\varphi(z)$, $z = (m -
    \theta^*)/s$ (``eq-igp-ei``); equal to $\max(m - \theta^*, 0)$ where $s = 0$."""
    mean, sd = np.asarray(mean, float), np.asarray(sd, float)
    if mean.shape != sd.shape or (sd < 0).any() or not np.isfinite(best):
        raise ValueError("need matching shapes, non-negative sds and a finite incumbent")
    gap = mean - best
    safe = np.where(sd > 0, sd, 1.0)
    z = gap / safe
    return np.where(sd > 0, gap * norm.cdf(z) + safe * norm.pdf(z), np.maximum(gap, 0.0))


@dataclass(frozen=True)
class BOTrace:
    """Queried grid indices and the simple regret after each query."""

    queries: np.ndarray
    regret: np.ndarray


def gp_posterior_on_grid(prior_mean, prior_cov, observed: list[int], values, jitter=1e-6):
    """Posterior mean and sd on the grid of a GP observed (almost) noise-free at ``observed``."""
    if not observed:
        return prior_mean, np.sqrt(np.clip(np.diag(prior_cov), 0, None))
    idx = np.asarray(observed)
    K = prior_cov[np.ix_(idx, idx)] + jitter * np.eye(len(idx))
    cross = prior_cov[:, idx]
    weights = np.linalg.solve(K, cross.T)
    mean = prior_mean + weights.T @ (values[idx] - prior_mean[idx])
    var = np.diag(prior_cov) - np.einsum("ij,ji->i", cross, weights)
    return mean, np.sqrt(np.clip(var, 0, None))


def bayes_opt(values, prior_mean, prior_cov, n_iter: int, start: int) -> BOTrace:
    """Maximise ``values`` over the grid by EI from one initial query at index ``start``."""
    values = np.asarray(values, float)
    prior_mean, prior_cov = np.asarray(prior_mean, float), np.asarray(prior_cov, float)
    if prior_mean.shape != values.shape or prior_cov.shape != (len(values), len(values)):
        raise ValueError("prior mean and covariance must match the grid")
    if not 0 <= start < len(values) or n_iter < 1:
        raise ValueError(f"need a start index on the grid and n_iter >= 1, got {start}, {n_iter}")
    observed = [int(start)]
    regret = [values.max() - values[start]]
    for _ in range(n_iter):
        mean, sd = gp_posterior_on_grid(prior_mean, prior_cov, observed, values)
        ei = expected_improvement(mean, sd, values[observed].max())
        ei[observed] = -np.inf
        observed.append(int(np.argmax(ei)))
        regret.append(values.max() - values[observed].max())
    return BOTrace(np.asarray(observed), np.asarray(regret))


def causal_prior(mean, variance, base_cov):
    """Prior mean and covariance $\\sigma(a)\\sigma(a') + k(a, a')$ of the causal GP
    (``eq-igp-causal-prior``)."""
    sd = np.sqrt(np.clip(np.asarray(variance, float), 0, None))
    return np.asarray(mean, float), np.outer(sd, sd) + np.asarray(base_cov, float)
