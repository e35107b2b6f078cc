r"""Monte Carlo studies: populations, fitted models, sampling designs and their summaries.

A :class:`World` holds everything fixed before any label of the study is bought: a large pool
of units with their covariates, labels, predictions and fitted uncertainty scores, and the target's
value on the pool. :func:`run_study` then repeats "draw $n$ units from the pool, choose $\pi$,
sample, estimate" for several designs on the same populations and uniforms. Synthetic worlds use a
pool of simulated units, so predictions are computed once rather than once per replicate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats
from sklearn.ensemble import HistGradientBoostingRegressor
from threadpoolctl import threadpool_limits

from .estimators import (
    Kernel,
    UStatEstimate,
    aipw_ustatistic,
    classical_ustatistic,
    gini_kernel,
    gini_mean_difference,
    gini_row_sums,
    kendall_kernel,
    kendall_tau_a,
    prediction_row_sums,
)
from .sampling import (
    plugin_projection,
    poisson_sample,
    practical_inclusion,
    uniform_inclusion,
    water_filling,
)

Inclusion = Callable[["World", np.ndarray, float], np.ndarray]  # (world, rows, budget)


@dataclass(frozen=True)
class Target:
    """A U-statistic target: its kernel, how to build unit records and an exact reference value."""

    name: str
    kernel: Kernel
    records: Callable[[np.ndarray, np.ndarray], np.ndarray]
    exact: Callable[[np.ndarray, np.ndarray], float]


GINI = Target("Gini mean difference", gini_kernel, lambda X, y: np.asarray(y, float)[:, None],
              lambda X, y: gini_mean_difference(y))


def kendall_target(column: int = 0) -> Target:
    """Kendall's tau_a between covariate ``column`` and the label."""
    return Target(f"Kendall tau (x{column + 1}, y)", kendall_kernel,
                  lambda X, y: np.column_stack([X[:, column], y]),
                  lambda X, y: kendall_tau_a(X[:, column], y))


@dataclass(frozen=True)
class SyntheticDesign:
    r"""$X \sim U(0,1)^5$, $Y = f^*(X) + \sigma(X)\varepsilon$ (Eq. ``eq-synthetic``).

    Heteroscedastic: $\sigma(x) = 0.2 + 1.5\,\mathbb 1[x_1 > 0.8]$. The homoscedastic control
    uses the constant with the same mean noise variance, $\sigma^2 = E\,\sigma(X)^2 = 0.61$.
    """

    heteroscedastic: bool = True
    dim: int = 5

    def mean(self, X: np.ndarray) -> np.ndarray:
        return 3 * X[:, 0] + np.sin(2 * np.pi * X[:, 1]) + 0.5 * X[:, 2]

    def noise_sd(self, X: np.ndarray) -> np.ndarray:
        if self.heteroscedastic:
            return 0.2 + 1.5 * (X[:, 0] > 0.8)
        return np.full(len(X), np.sqrt(0.8 * 0.2**2 + 0.2 * 1.7**2))

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        X = rng.uniform(size=(n, self.dim))
        return X, self.mean(X) + self.noise_sd(X) * rng.standard_normal(n)


class SortedProjection:
    r"""Exact $g(y) = \frac1N \sum_k |y - y_k|$ over a reference sample, by binary search."""

    def __init__(self, reference) -> None:
        self.reference = np.asarray(reference, float)

    def __call__(self, y) -> np.ndarray:
        y = np.asarray(y, float)
        return gini_row_sums(y.ravel(), self.reference).reshape(y.shape) / len(self.reference)


def gini_oracle_scores(design: SyntheticDesign, projection: SortedProjection,
                       nodes: int = 40) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    r"""$\sqrt{e(x)}$, $e(x) = E[(g(Y) - g(\hat y))^2 \mid X = x]$, by Gauss-Hermite quadrature."""
    points, weights = np.polynomial.hermite_e.hermegauss(nodes)
    weights = weights / weights.sum()

    def scores(X: np.ndarray, predictions: np.ndarray) -> np.ndarray:
        y = design.mean(X)[:, None] + design.noise_sd(X)[:, None] * points[None, :]
        gap = projection(y) - projection(predictions)[:, None]
        return np.sqrt(gap**2 @ weights)

    return scores


def fit_regressor(X, y, seed: int) -> Callable[[np.ndarray], np.ndarray]:
    """A gradient-boosted regression tree model, returned as its predict function.

    Fit and prediction run on one OpenMP thread: these models are small, and with sleeping
    (``OMP_WAIT_POLICY=PASSIVE``) threads each tree split pays a wake-up that costs 20 times the
    split itself.
    """
    model = HistGradientBoostingRegressor(max_iter=100, learning_rate=0.1, random_state=seed)
    with threadpool_limits(limits=1, user_api="openmp"):
        model.fit(X, y)

    def predict(X_new: np.ndarray) -> np.ndarray:
        with threadpool_limits(limits=1, user_api="openmp"):
            return model.predict(X_new)

    return predict


def fit_uncertainty(X, y, predictor, target: Target, seed: int):
    r"""The practical rule's $\hat u(x) \approx \sqrt{e(x)}$ (Eq. ``eq-practical-rule``).

    On a labelled pilot sample, regress $|\hat g(Z_i) - \hat g(\hat Z_i)|$ on $X_i$, where
    $\hat g$ is the plug-in projection over the pilot records and $\hat Z_i$ uses the prediction.
    """
    projection = plugin_projection(target.kernel, target.records(X, y))
    gap = projection(target.records(X, y)) - projection(target.records(X, predictor(X)))
    model = fit_regressor(X, np.abs(gap), seed)
    return lambda X_new: np.clip(model(X_new), 0.0, None)


@dataclass
class World:
    r"""A pool of units and everything fixed before labelling, for one target.

    ``uncertainty`` holds the practical rule's scores and ``oracle`` the true $\sqrt{e(x)}$ (if
    known) for every pool unit; ``truth`` is the target's U-statistic over the whole pool.
    """

    X: np.ndarray
    y: np.ndarray
    predictions: np.ndarray
    uncertainty: np.ndarray
    target: Target
    oracle: np.ndarray | None = None
    truth: float = field(init=False)

    def __post_init__(self) -> None:
        arrays = {"X": self.X, "predictions": self.predictions, "uncertainty": self.uncertainty,
                  "oracle": self.oracle}
        for name, array in arrays.items():
            if array is not None and len(array) != len(self.y):
                raise ValueError(f"{name} has {len(array)} rows, y has {len(self.y)}")
        self.truth = self.target.exact(self.X, self.y)


def synthetic_worlds(design: SyntheticDesign, targets: list[Target], n_train: int, n_pilot: int,
                     n_pool: int, seed: int) -> dict[str, World]:
    """Train one predictor, then one uncertainty model per target on a disjoint pilot sample."""
    rng = np.random.default_rng(seed)
    predictor = fit_regressor(*design.sample(n_train, rng), seed)
    X_pilot, y_pilot = design.sample(n_pilot, rng)
    X, y = design.sample(n_pool, rng)
    predictions = predictor(X)
    worlds = {}
    for target in targets:
        uncertainty = fit_uncertainty(X_pilot, y_pilot, predictor, target, seed)(X)
        oracle = None
        if target.kernel is gini_kernel:
            oracle = gini_oracle_scores(design, SortedProjection(y))(X, predictions)
        worlds[target.name] = World(X, y, predictions, uncertainty, target, oracle)
    return worlds


def uniform_design(world: World, rows, budget) -> np.ndarray:
    """The uniform rule pi = B / n (non-active, prediction-powered)."""
    return uniform_inclusion(len(rows), budget)


def active_design(tau: float = 0.2) -> Inclusion:
    """The practical rule with mixing weight ``tau``."""
    return lambda world, rows, budget: practical_inclusion(world.uncertainty[rows], budget, tau)


def oracle_design(world: World, rows, budget) -> np.ndarray:
    r"""The water-filling rule on the true $\sqrt{e(x)}$ (synthetic worlds only)."""
    if world.oracle is None:
        raise ValueError("this world has no oracle uncertainty")
    return water_filling(world.oracle[rows], budget)


CLASSICAL = None  # design marker: ordinary U-statistic on a uniform sample, predictions unused


def standard_designs(tau: float = 0.2, oracle: bool = False) -> dict[str, Inclusion | None]:
    """Classical, uniform AIPW, active AIPW and, optionally, the oracle rule."""
    designs = {"classical": CLASSICAL, "uniform": uniform_design, "active": active_design(tau)}
    if oracle:
        designs["oracle"] = oracle_design
    return designs


@dataclass
class StudyResult:
    """Estimates and standard errors of every design over the replicates."""

    truth: float
    budget: float
    level: float
    estimates: dict[str, list[float]] = field(default_factory=dict)
    std_errors: dict[str, list[float]] = field(default_factory=dict)
    labels: dict[str, list[int]] = field(default_factory=dict)

    def add(self, name: str, result: UStatEstimate) -> None:
        self.estimates.setdefault(name, []).append(result.estimate)
        self.std_errors.setdefault(name, []).append(result.std_error)
        self.labels.setdefault(name, []).append(result.n_labels)

    def squared_errors(self, name: str) -> np.ndarray:
        """Per-replicate squared errors: paired across designs, which share every replicate."""
        return (np.asarray(self.estimates[name]) - self.truth) ** 2

    def mse(self, name: str) -> float:
        return float(np.mean(self.squared_errors(name)))

    def covered(self, name: str) -> np.ndarray:
        """Per-replicate 0/1: did the design's interval cover the truth?"""
        half = self._half_width(name)
        return np.abs(np.asarray(self.estimates[name]) - self.truth) <= half

    def coverage(self, name: str) -> float:
        return float(np.mean(self.covered(name)))

    def width(self, name: str) -> float:
        return float(2 * np.mean(self._half_width(name)))

    def _half_width(self, name: str) -> np.ndarray:
        return stats.norm.ppf(0.5 + self.level / 2) * np.asarray(self.std_errors[name])

    def summary(self) -> pd.DataFrame:
        """MSE, coverage, mean width, mean labels and effective sample size per design."""
        reference = self.mse("classical") if "classical" in self.estimates else np.nan
        rows = {name: {"MSE": self.mse(name), "coverage": self.coverage(name),
                       "width": self.width(name), "labels": np.mean(self.labels[name]),
                       "ESS": reference / self.mse(name) * self.budget}
                for name in self.estimates}
        return pd.DataFrame(rows).T


def run_study(world: World, designs: dict[str, Inclusion | None], n: int, budget: float,
              replicates: int, seed: int, level: float = 0.9) -> StudyResult:
    """Repeat: draw n pool units, choose pi, Poisson-sample, estimate with every design.

    All designs see the same population and the same uniforms in a replicate, so their
    differences are not blurred by different draws; they also share the prediction-only part
    of the AIPW computation.
    """
    if not 2 <= n <= len(world.y):
        raise ValueError(f"population size must be in [2, {len(world.y)}], got {n}")
    rng = np.random.default_rng(seed)
    kernel = world.target.kernel
    result = StudyResult(world.truth, budget, level)
    for _ in range(replicates):
        rows = rng.choice(len(world.y), size=n, replace=False)
        uniforms = rng.uniform(size=n)
        truth_records = world.target.records(world.X[rows], world.y[rows])
        predicted_records = world.target.records(world.X[rows], world.predictions[rows])
        shared = prediction_row_sums(predicted_records, kernel)
        for name, inclusion in designs.items():
            pi = (inclusion or uniform_design)(world, rows, budget)
            sampled = poisson_sample(pi, uniforms)
            observed = np.where(sampled[:, None], truth_records, np.nan)
            if inclusion is None:
                result.add(name, classical_ustatistic(observed, sampled, kernel))
            else:
                result.add(name, aipw_ustatistic(observed, predicted_records, pi, sampled, kernel,
                                                 shared))
    return result
