r"""Data for the chapter: the mediator chain of the paper's ablation and a back-door problem.

* :func:`mediator_chain` (``eq-igp-chain``): $Z \sim U(0, 1)$, $V_j = \sin(c_j Z) + \epsilon_j$,
  $Y = \sum_j \sin(V_j) / j + \epsilon$, with noise variances proportional to the signal's. The
  interventional function is exact: $E \sin(V_j) = \sin(\sin(c_j z))\, e^{-s_j^2/2}$.
* :func:`diabetes_backdoor` (``eq-igp-backdoor-design``): real covariates (age, BMI, blood
pressure) of the
  diabetes data bundled with scikit-learn confound a simulated treatment and mediator.

Each problem keeps its ground truth apart from the observed data: :meth:`observed` returns only
what a method may see, and :meth:`truth` is computed on demand for the evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from icml26.core import check_count

from .posterior import FusedData, Intervention


def _check_noise(noise) -> float:
    if not (isinstance(noise, (int, float, np.floating)) and np.isfinite(noise) and noise > 0):
        raise ValueError(f"noise must be a positive finite number, got {noise!r}")
    return float(noise)


def chain_effect(z, coefs_v, coefs_y, noise_sd_v) -> np.ndarray:
    r"""$E[Y \mid do(Z = z)] = \sum_j w_j \sin(\sin(c_j z))\, e^{-s_j^2 / 2}$, exactly."""
    z = np.asarray(z, dtype=float).reshape(-1, 1)
    damping = np.exp(-np.asarray(noise_sd_v) ** 2 / 2)
    return (np.sin(np.sin(z * coefs_v)) * damping * coefs_y).sum(1)


@dataclass(frozen=True)
class MediatorChain:
    """One draw of the mediator chain $Z \\to V \\to Y$ with its intervention grid."""

    Z: np.ndarray
    V: np.ndarray
    Y: np.ndarray
    grid: np.ndarray
    coefs_v: np.ndarray
    coefs_y: np.ndarray
    noise_sd_v: np.ndarray
    noise_sd_y: float

    def observed(self) -> FusedData:
        """The data a method may use: one data set for both stages."""
        return FusedData.single(self.Z, self.V, self.Y)

    def intervention(self) -> Intervention:
        return Intervention(self.grid)

    def truth(self) -> np.ndarray:
        """The exact interventional function on the grid (evaluation only)."""
        return chain_effect(self.grid, self.coefs_v, self.coefs_y, self.noise_sd_v)

    def monte_carlo_truth(self, samples: int, seed: int) -> np.ndarray:
        """The same function by Monte Carlo over $V \\mid do(z)$, as the paper's code does."""
        rng = np.random.default_rng(seed)
        z = self.grid.reshape(-1, 1, 1)
        noise = rng.standard_normal((1, samples, len(self.coefs_v))) * self.noise_sd_v
        V = np.sin(z * self.coefs_v) + noise
        return (np.sin(V) * self.coefs_y).sum(-1).mean(1)


def mediator_chain(n: int, d: int = 5, noise: float = 0.5, seed: int = 0, grid_size: int = 50,
                   low: float = 0.0, high: float = 1.0) -> MediatorChain:
    """Simulate the mediator chain of ``eq-igp-chain`` (the ``Abelation`` design of the authors'
    code)."""
    n = check_count(n, "n", 3)
    d = check_count(d, "d", 1)
    grid_size = check_count(grid_size, "grid_size", 2)
    noise = _check_noise(noise)
    if not (np.isfinite(low) and np.isfinite(high) and low < high):
        raise ValueError(f"need finite low < high, got {low}, {high}")
    rng = np.random.default_rng(seed)
    coefs_v = 10 * np.linspace(1, 4, d)
    coefs_y = 1 / np.arange(1, d + 1)
    Z = rng.uniform(0, 1, (n, 1))
    signal_v = np.sin(Z * coefs_v)
    noise_sd_v = np.sqrt(noise * signal_v.var(0, ddof=1))
    V = signal_v + noise_sd_v * rng.standard_normal((n, d))
    signal_y = (np.sin(V) * coefs_y).sum(1)
    noise_sd_y = float(np.sqrt(noise * signal_y.var(ddof=1)))
    Y = signal_y + noise_sd_y * rng.standard_normal(n)
    grid = np.linspace(low, high, grid_size)[:, None]
    return MediatorChain(Z, V, Y, grid, coefs_v, coefs_y, noise_sd_v, noise_sd_y)


DIABETES_COLUMNS = ("age", "bmi", "bp")
"""The covariates $W$ taken from ``sklearn.datasets.load_diabetes`` (442 patients)."""

BACKDOOR = {"a_bmi": 0.8, "a_bp": 0.5, "sd_a": 0.6, "v_slope": 1.5, "v_bmi": 0.6,
            "v_age": -0.3, "sd_v": 0.3, "y_freq": 1.5, "y_slope": 0.4, "sd_y": 0.2}
"""Coefficients of the back-door design, ``eq-igp-backdoor-design``."""


def diabetes_covariates() -> np.ndarray:
    """Standardised age, BMI and blood pressure of the 442 patients of the diabetes data."""
    from sklearn.datasets import load_diabetes

    data = load_diabetes()
    W = data.data[:, [data.feature_names.index(c) for c in DIABETES_COLUMNS]]
    return (W - W.mean(0)) / W.std(0)


@dataclass(frozen=True)
class DiabetesBackdoor:
    """Back-door problem $W \\to A$, $W \\to V$, $A \\to V \\to Y$ with real covariates $W$."""

    A: np.ndarray
    W: np.ndarray
    V: np.ndarray
    Y: np.ndarray
    grid: np.ndarray
    link: float = 1.0  # 0 for the falsification control: W enters neither A nor V

    def observed(self, adjust: bool = True) -> FusedData:
        """Inputs of the $V$-stage are $(A, W)$, or $A$ alone for the unadjusted analysis."""
        inputs = np.column_stack([self.A, self.W]) if adjust else self.A[:, None]
        return FusedData.single(inputs, self.V[:, None], self.Y)

    def intervention(self, adjust: bool = True) -> Intervention:
        """Intervene on column 0 ($A$); with ``adjust`` the columns of $W$ are averaged out."""
        return Intervention(self.grid, columns=(0,) if adjust else None)

    def truth(self) -> np.ndarray:
        """$\\frac1n\\sum_i E[h(V) \\mid A = a, W_i]$ in closed form (evaluation only)."""
        return backdoor_effect(self.grid, self.W, self.link)


def _mediator_mean(a, W, link: float = 1.0):
    r"""$\mu(a, w)$: elementwise for ``a`` of shape ``(n,)``, all pairs for ``a`` of ``(N, 1)``;
    ``link`` scales the covariates' coefficients."""
    c = BACKDOOR
    return c["v_slope"] * np.tanh(a) + link * (c["v_bmi"] * W[:, 1] + c["v_age"] * W[:, 0])


def backdoor_effect(grid, W, link: float = 1.0) -> np.ndarray:
    r"""$\frac1n \sum_i \big[\cos(\omega \mu_i)\,e^{-\omega^2 s_V^2 / 2} + b\,\mu_i\big]$ with
    $\mu_i = \mu(a, W_i)$: the adjusted effect of ``eq-igp-backdoor-design``."""
    c = BACKDOOR
    mu = _mediator_mean(np.asarray(grid, dtype=float).reshape(-1, 1), W, link)
    damping = np.exp(-(c["y_freq"] * c["sd_v"]) ** 2 / 2)
    return (np.cos(c["y_freq"] * mu) * damping + c["y_slope"] * mu).mean(1)


def diabetes_backdoor(seed: int = 0, grid_size: int = 50, n: int | None = None,
                      confounded: bool = True) -> DiabetesBackdoor:
    """Simulate treatment, mediator and outcome on the real diabetes covariates
    (``eq-igp-backdoor-design``).

    ``n`` patients are drawn without replacement (all 442 by default). With
    ``confounded=False`` the covariates enter neither the treatment nor the mediator (their
    coefficients are 0), the falsification control: adjusting for $W$ can then neither remove bias
    nor explain variance, so it should not change the error.
    """
    if not isinstance(confounded, bool):
        raise TypeError(f"confounded must be a bool, got {type(confounded).__name__}")
    grid_size = check_count(grid_size, "grid_size", 2)
    c = BACKDOOR
    rng = np.random.default_rng(seed)
    W = diabetes_covariates()
    if n is not None:
        n = check_count(n, "n", 10)
        if n > len(W):
            raise ValueError(f"the diabetes data have {len(W)} patients, asked for {n}")
        W = W[rng.choice(len(W), n, replace=False)]
    n = len(W)
    link = 1.0 if confounded else 0.0
    A = link * (c["a_bmi"] * W[:, 1] + c["a_bp"] * W[:, 2]) + c["sd_a"] * rng.standard_normal(n)
    V = _mediator_mean(A, W, link) + c["sd_v"] * rng.standard_normal(n)
    Y = np.cos(c["y_freq"] * V) + c["y_slope"] * V + c["sd_y"] * rng.standard_normal(n)
    grid = np.linspace(*np.quantile(A, [0.05, 0.95]), grid_size)
    return DiabetesBackdoor(A, W, V, Y, grid[:, None], link)
