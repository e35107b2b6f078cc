r"""Closed-form posterior moments of $\theta(a) = E[Y \mid do(A = a)]$ (chapter ``eq-igp-post-f``,
``eq-igp-post-u``, ``eq-igp-mean``, ``eq-igp-cov-split``, ``eq-igp-r-matrix``, ``eq-igp-terms``).

Two data sets may be fused: $\mathcal D_0 = \{(a_i, v^0_i)\}$ for the stage $V \mid A$ and
$\mathcal D_1 = \{(v^1_j, y_j)\}$ for the stage $Y \mid V$. IMPspec puts
$f \sim \mathcal{GP}(0, k_V)$ and i.i.d. $\mathcal{GP}(0, k_A)$ priors on the spectral
coordinates of the conditional mean embedding; exact BayesIMP differs only in the prior of
$f$, the nuclear-dominant kernel $r$.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from .kernels import (
    DTYPE,
    GaussianKernel,
    GaussianMeasure,
    as_matrix,
    data_measure,
    integral_operator_gram,
    kernel_chain_gram,
    kernel_chain_trace,
    stable_cholesky,
    unit_gaussian_gram,
)


@dataclass(frozen=True)
class FusedData:
    """$\\mathcal D_0 = (A, V_0)$ and $\\mathcal D_1 = (V_1, Y)$; ``paired`` if they are one set."""

    A: torch.Tensor
    V0: torch.Tensor
    V1: torch.Tensor
    Y: torch.Tensor
    paired: bool = False

    def __post_init__(self):
        A, V0 = as_matrix(self.A, "A", 2), as_matrix(self.V0, "V0", 2)
        V1 = as_matrix(self.V1, "V1", 2)
        Y = as_matrix(self.Y, "Y", 2)
        if Y.shape[1] != 1:
            raise ValueError(f"Y must be one outcome per row, got shape {tuple(Y.shape)}")
        if A.shape[0] != V0.shape[0]:
            raise ValueError(f"D0 is mismatched: A has {A.shape[0]} rows, V0 has {V0.shape[0]}")
        if V1.shape[0] != Y.shape[0]:
            raise ValueError(f"D1 is mismatched: V1 has {V1.shape[0]} rows, Y has {Y.shape[0]}")
        if V0.shape[1] != V1.shape[1]:
            raise ValueError(f"V0 and V1 need the same columns, got {V0.shape[1]}, {V1.shape[1]}")
        if self.paired and (V0.shape != V1.shape or not torch.equal(V0, V1)):
            raise ValueError("paired data must use the same V in both stages")
        for name, value in (("A", A), ("V0", V0), ("V1", V1), ("Y", Y[:, 0])):
            object.__setattr__(self, name, value)

    @classmethod
    def single(cls, A, V, Y) -> FusedData:
        """One data set $(A, V, Y)$ used for both stages."""
        V = as_matrix(V, "V", 2)
        return cls(A, V, V, Y, paired=True)

    def resample(self, rows0: torch.Tensor, rows1: torch.Tensor) -> FusedData:
        """The data set with rows ``rows0`` of $\\mathcal D_0$ and ``rows1`` of $\\mathcal D_1$."""
        if self.paired:
            return FusedData.single(self.A[rows0], self.V0[rows0], self.Y[rows0])
        return replace(self, A=self.A[rows0], V0=self.V0[rows0], V1=self.V1[rows1],
                       Y=self.Y[rows1])


@dataclass(frozen=True)
class GPStage:
    """Kernel and noise variance of one regression stage ($Y \\mid V$ or $V \\mid A$)."""

    kernel: GaussianKernel
    noise: float

    def __post_init__(self):
        if not (np.isfinite(self.noise) and self.noise > 0):
            raise ValueError(f"noise variance must be positive and finite, got {self.noise}")
        object.__setattr__(self, "noise", float(self.noise))


@dataclass(frozen=True)
class Intervention:
    """Interventions $do(A_S = a)$ on the columns ``columns`` of $A$ (all columns if ``None``).

    Columns of $A$ that are not intervened on are averaged over their empirical distribution in
    $\\mathcal D_0$ (the back-door adjustment, ``eq-igp-backdoor``).
    """

    values: torch.Tensor
    columns: tuple[int, ...] | None = None

    def __post_init__(self):
        object.__setattr__(self, "values", as_matrix(self.values, "intervention values"))
        if self.columns is not None:
            columns = tuple(int(c) for c in self.columns)
            if len(set(columns)) != len(columns) or not columns:
                raise ValueError(f"intervened columns must be distinct and non-empty: {columns}")
            if len(columns) != self.values.shape[1]:
                raise ValueError(f"{len(columns)} columns but values have {self.values.shape[1]}")
            object.__setattr__(self, "columns", columns)

    def kernels(self, kernel: GaussianKernel, A: torch.Tensor):
        """$k_A(\\text{query}, A)$ and $k_A(\\text{query}, \\text{query})$, averaged if needed."""
        if self.columns is None:
            if self.values.shape[1] != A.shape[1]:
                raise ValueError(f"interventions have {self.values.shape[1]} columns, A has "
                                 f"{A.shape[1]}; name the intervened columns")
            return kernel.gram(self.values, A), kernel.gram(self.values)
        if max(self.columns) >= A.shape[1] or min(self.columns) < 0:
            raise ValueError(f"intervened columns {self.columns} outside A's {A.shape[1]} columns")
        rest = [c for c in range(A.shape[1]) if c not in self.columns]
        ell, cols = kernel.lengthscale, list(self.columns)
        K_do = unit_gaussian_gram(self.values, A[:, cols], ell[cols])
        K_do_do = unit_gaussian_gram(self.values, self.values, ell[cols])
        if not rest:
            return kernel.outputscale * K_do, kernel.outputscale * K_do_do
        K_rest = unit_gaussian_gram(A[:, rest], A[:, rest], ell[rest])
        # Product kernel: averaging over W acts on the W factor only.
        return (kernel.outputscale * K_do * K_rest.mean(0)[None, :],
                kernel.outputscale * K_do_do * K_rest.mean())


@dataclass(frozen=True)
class VarianceTerms:
    """The three posterior covariance terms of ``eq-igp-terms``, each ``(N, N)``."""

    v1: torch.Tensor
    v2: torch.Tensor
    v3: torch.Tensor

    @property
    def total(self) -> torch.Tensor:
        return self.v1 + self.v2 + self.v3


def treatment_weights(data: FusedData, treatment: GPStage, intervention: Intervention):
    r"""$\beta(a) = (K_A + \sigma_A^2 I)^{-1} k_A(A, a)$ and $\kappa(a, a')$ (``eq-igp-post-u``)."""
    K_qA, K_qq = intervention.kernels(treatment.kernel, data.A)
    K_A = treatment.kernel.gram(data.A)
    chol = stable_cholesky(K_A + treatment.noise * torch.eye(len(K_A), dtype=DTYPE))
    beta = torch.cholesky_solve(K_qA.T, chol)  # (n0, N)
    kappa = K_qq - K_qA @ beta
    return beta, 0.5 * (kappa + kappa.T)


def _moments(f_gram11, f_gram01, f_gram00, noise, Y, beta, kappa):
    """Mean, the $V_3$ term and the pieces shared by the $V_1$, $V_2$ terms."""
    chol = stable_cholesky(f_gram11 + noise * torch.eye(len(f_gram11), dtype=DTYPE))
    alpha = torch.cholesky_solve(Y[:, None], chol)[:, 0]
    mean = beta.T @ (f_gram01 @ alpha)
    cond00 = f_gram00 - f_gram01 @ torch.cholesky_solve(f_gram01.T, chol)
    v3 = beta.T @ cond00 @ beta
    return mean, 0.5 * (v3 + v3.T), alpha, chol


def _spectral_terms(alpha, chol, norm_gram, trace, kappa):
    """$V_1 = \\kappa\\,\\alpha^\\top R \\alpha$ and $V_2 = \\kappa(\\tau - \\operatorname{tr}
    [(K + \\sigma^2 I)^{-1} R])$ of ``eq-igp-terms``."""
    squared_norm = alpha @ norm_gram @ alpha
    residual = trace - torch.trace(torch.cholesky_solve(norm_gram, chol))
    return kappa * squared_norm, kappa * residual


class ImpspecPosterior:
    """IMPspec posterior of $\\theta$ on ``intervention`` (``eq-igp-mean``, ``eq-igp-terms``).

    Everything but $V_1$ and $V_2$ is independent of the measure $\\nu$, so it is computed once;
    :meth:`terms` then costs one matrix $R$ per measure scale (used by the calibration).
    """

    def __init__(self, data: FusedData, outcome: GPStage, treatment: GPStage,
                 intervention: Intervention):
        if outcome.kernel.dim != data.V1.shape[1]:
            raise ValueError(f"outcome kernel has {outcome.kernel.dim} inputs, V has "
                             f"{data.V1.shape[1]} columns")
        self.data, self.outcome = data, outcome
        beta, self.kappa = treatment_weights(data, treatment, intervention)
        k = outcome.kernel
        self.mean, self.v3, self.alpha, self._chol = _moments(
            k.gram(data.V1), k.gram(data.V0, data.V1), k.gram(data.V0), outcome.noise, data.Y,
            beta, self.kappa)
        self.beta = beta

    def measure(self, scale: float) -> GaussianMeasure:
        """$\\nu = \\mathcal N(\\bar v, \\operatorname{diag}(\\text{scale} \\cdot sd(V_1))^2)$."""
        return data_measure(self.data.V1, scale)

    def terms(self, scale: float = 1.0) -> VarianceTerms:
        """$V_1, V_2, V_3$ of ``eq-igp-terms`` for the measure of the given scale."""
        measure = self.measure(scale)
        R = integral_operator_gram(self.outcome.kernel, measure, self.data.V1)
        tau = kernel_chain_trace(self.outcome.kernel, measure, 0)
        v1, v2 = _spectral_terms(self.alpha, self._chol, R, tau, self.kappa)
        return VarianceTerms(v1, v2, self.v3)

    def covariance(self, scale: float = 1.0) -> torch.Tensor:
        return self.terms(scale).total

    def variance(self, scale: float = 1.0) -> torch.Tensor:
        """Latent posterior variance of $\\theta$ at each intervention, clamped at zero."""
        return torch.diagonal(self.covariance(scale)).clamp_min(0.0)


@dataclass(frozen=True)
class Moments:
    """Posterior mean ``(N,)`` and covariance ``(N, N)`` with its terms."""

    mean: torch.Tensor
    terms: VarianceTerms

    @property
    def covariance(self) -> torch.Tensor:
        return self.terms.total

    @property
    def variance(self) -> torch.Tensor:
        return torch.diagonal(self.covariance).clamp_min(0.0)


def bayesimp_moments(data: FusedData, outcome: GPStage, treatment: GPStage,
                     intervention: Intervention, measure: GaussianMeasure) -> Moments:
    r"""Exact BayesIMP: $f \sim \mathcal{GP}(0, r)$ with $r = R$ (``eq-igp-bayesimp``).

    The moments are those of ``eq-igp-terms`` with $k_V \to r$, $R \to S$ (the depth-3 kernel chain)
    and $\tau \to \int r(u, u)\,\nu(du)$: every integral is closed form, no Monte Carlo.
    """
    beta, kappa = treatment_weights(data, treatment, intervention)
    k = outcome.kernel

    def r(X, Y=None):
        return integral_operator_gram(k, measure, X, Y)

    mean, v3, alpha, chol = _moments(r(data.V1), r(data.V0, data.V1), r(data.V0),
                                     outcome.noise, data.Y, beta, kappa)
    S = kernel_chain_gram(k, measure, data.V1, depth=3)
    v1, v2 = _spectral_terms(alpha, chol, S, kernel_chain_trace(k, measure, 1), kappa)
    return Moments(mean, VarianceTerms(v1, v2, v3))


BAYESIMP_WEIGHTS = ("kernel", "nuclear")


def bayesimp_code_moments(data: FusedData, outcome: GPStage, treatment: GPStage,
                          intervention: Intervention, measure: GaussianMeasure,
                          ridge: float = 1e-4, weights: str = "kernel",
                          exact: Moments | None = None) -> Moments:
    r"""BayesIMP with the variance formula of the authors' baseline code (exact $R$ inside).

    The mean and $V_3$ are those of :func:`bayesimp_moments`. The two $\kappa$ terms replace
    the integrals by projections on $\operatorname{span}\{k(\cdot, v^1_i)\}$
    (Eq. ``eq-igp-bayesimp-code``): $S \approx R K^{-1} R K^{-1} R$, $\int r(u, u)\,\nu(du)
    \approx \operatorname{tr}[(K^{-1}R)^2]$ with $K = K_{11} + \text{ridge}\,I$. The norm
    term's weights are $\alpha_r = (R + \sigma^2 I)^{-1} y$ with ``weights="nuclear"`` (the
    posterior weights under $r$: the authors' current formula, from commit 21c8e91 to 380913a of
    their code) or $\alpha = (K_{11} + \sigma^2 I)^{-1} y$ with ``weights="kernel"`` (the
    superseded formula, as stored at commit ff40a32). ``exact`` may pass the moments of
    :func:`bayesimp_moments` for the same arguments, computed once for several formulas.
    """
    if weights not in BAYESIMP_WEIGHTS:
        raise ValueError(f"weights must be one of {BAYESIMP_WEIGHTS}, got {weights!r}")
    if exact is None:
        exact = bayesimp_moments(data, outcome, treatment, intervention, measure)
    k = outcome.kernel
    R = integral_operator_gram(k, measure, data.V1)
    K = k.gram(data.V1)
    eye = torch.eye(len(K), dtype=DTYPE)
    chol_ridge = stable_cholesky(K + ridge * eye)
    K_inv_R = torch.cholesky_solve(R, chol_ridge)
    weight_gram = K if weights == "kernel" else R
    alpha = torch.cholesky_solve(data.Y[:, None],
                                 stable_cholesky(weight_gram + outcome.noise * eye))
    R_bar = R - R @ torch.cholesky_solve(R, stable_cholesky(R + outcome.noise * eye))
    _, kappa = treatment_weights(data, treatment, intervention)
    norm_term = (alpha.T @ R @ K_inv_R @ K_inv_R @ alpha).squeeze()
    trace_term = torch.trace(K_inv_R @ torch.cholesky_solve(R_bar, chol_ridge))
    return Moments(exact.mean, VarianceTerms(kappa * norm_term, kappa * trace_term,
                                             exact.terms.v3))


def outcome_posterior(V, Y, outcome: GPStage, X, prior_gram=None):
    """Posterior mean and covariance of $f$ at ``X`` given $(V, Y)$ (``eq-igp-post-f``).

    ``prior_gram(A, B)`` is the prior kernel, ``outcome.kernel.gram`` by default.
    """
    gram = prior_gram or outcome.kernel.gram
    V, X = as_matrix(V, "V", 2), as_matrix(X, "X")
    Y = as_matrix(Y, "Y", 2)[:, 0]
    chol = stable_cholesky(gram(V, V) + outcome.noise * torch.eye(len(V), dtype=DTYPE))
    K_xv = gram(X, V)
    mean = K_xv @ torch.cholesky_solve(Y[:, None], chol)[:, 0]
    cov = gram(X, X) - K_xv @ torch.cholesky_solve(K_xv.T, chol)
    return mean, 0.5 * (cov + cov.T)
