r"""U-statistic empirical risk minimisation with active labels: pairwise logistic ranking.

For units with covariates $x_i$ and labels $y_i$, the pair loss with
$t_{ij} = (x_i - x_j)^\top\beta$ and $s_{ij} = \operatorname{sign}(y_i - y_j)$ is

$\ell_\beta = \tfrac12[\log(1 + e^{t}) + \log(1 + e^{-t})] - \tfrac12 s\, t$,

which equals $\log(1 + e^{-s t})$ whenever $s = \pm 1$ and is linear in $s$. So its AIPW version
only needs the AIPW sign matrix $\tilde S_{ij}$, and stays convex even though some masses are
negative. Chapter equations ``eq-ranking-loss``, ``eq-ranking-score`` and ``eq-sandwich``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from .estimators import as_records, check_inclusion, check_sampled, ipw_weights


@dataclass(frozen=True)
class RankingFit:
    """Fitted coefficients, their sandwich covariance and the Newton steps taken."""

    beta: np.ndarray
    covariance: np.ndarray
    iterations: int

    def interval(self, index: int, level: float = 0.9) -> tuple[float, float]:
        """Normal interval for one coefficient from the sandwich covariance."""
        half = stats.norm.ppf(0.5 + level / 2) * np.sqrt(self.covariance[index, index])
        return self.beta[index] - half, self.beta[index] + half


def aipw_sign_matrix(labels, predictions, pi, sampled) -> np.ndarray:
    r"""The AIPW sign matrix, with a zero diagonal.

    $\tilde S_{ij} = \iint \operatorname{sign}(y - y')\, d\hat\mu_i(y)\, d\hat\mu_j(y')$.
    """
    labels, predictions = np.asarray(labels, float), np.asarray(predictions, float)
    if labels.ndim != 1 or labels.shape != predictions.shape:
        raise ValueError("labels and predictions must be 1-D arrays of equal length")
    sampled = check_sampled(sampled, labels[:, None])
    w = ipw_weights(check_inclusion(pi, len(labels)), sampled)
    known = np.where(sampled, labels, predictions)  # any finite value where w = 0
    values, masses = (predictions, known), (1 - w, w)
    signs = np.zeros((len(labels), len(labels)))
    for left, left_mass in zip(values, masses, strict=True):
        for right, right_mass in zip(values, masses, strict=True):
            signs += np.outer(left_mass, right_mass) * np.sign(left[:, None] - right[None, :])
    np.fill_diagonal(signs, 0.0)
    return signs


def ranking_score_parts(X: np.ndarray, beta: np.ndarray, signs: np.ndarray):
    r"""Per-unit scores $\hat\psi_i$ (Eq. ``eq-ranking-score``) and the Hessian of the risk."""
    n = len(X)
    scores = X @ beta
    t = scores[:, None] - scores[None, :]
    residual = (np.tanh(t / 2) - signs) / 2  # d loss / d t, zero on the diagonal
    np.fill_diagonal(residual, 0.0)
    psi = (residual.sum(axis=1)[:, None] * X - residual @ X) / (n - 1)
    curvature = 1 / (4 * np.cosh(t / 2) ** 2)
    np.fill_diagonal(curvature, 0.0)
    laplacian = np.diag(curvature.sum(axis=1)) - curvature
    hessian = 2 * X.T @ laplacian @ X / (n * (n - 1))
    return psi, hessian


def fit_pairwise_ranking(X, labels, predictions, pi, sampled, max_iter: int = 50,
                         tol: float = 1e-10) -> RankingFit:
    r"""Minimise the AIPW pairwise ranking risk by Newton's method; sandwich covariance.

    The risk is convex (its Hessian does not involve the labels), so Newton's method converges
    from $\beta = 0$ whenever a minimiser exists. Eq. ``eq-sandwich``:
    $\widehat{\mathrm{Cov}}(\hat\beta) = H^{-1}(4 \hat V_\psi / n)H^{-1}$.
    """
    X = as_records(X, "X")
    if len(X) != len(np.asarray(labels)):
        raise ValueError(f"X has {len(X)} rows but labels have {len(np.asarray(labels))}")
    signs = aipw_sign_matrix(labels, predictions, pi, sampled)
    beta, iterations, converged = np.zeros(X.shape[1]), 0, False
    while not converged:
        if iterations == max_iter:
            raise RuntimeError(f"Newton's method did not converge in {max_iter} steps "
                               "(the AIPW risk may have no minimiser at this budget)")
        psi, hessian = ranking_score_parts(X, beta, signs)
        step = np.linalg.solve(hessian, psi.mean(axis=0))
        beta, iterations = beta - step, iterations + 1
        converged = np.max(np.abs(step)) < tol * (1 + np.max(np.abs(beta)))
    psi, hessian = ranking_score_parts(X, beta, signs)
    inverse = np.linalg.inv(hessian)
    covariance = inverse @ (4 * np.cov(psi, rowvar=False) / len(X)) @ inverse
    return RankingFit(beta, covariance, iterations)
