r"""The mixed-precision allocation as an integer linear program, plus two independent checks.

Binary $x_{s,o}$ picks option $o$ at site $s$; binary $y_{k,c,a}$ marks that communication site
$k$ runs at $c$ while its consumer GEMM runs at $a$, so that the alignment cost of
{eq}`eq-ccq-align` enters linearly ({eq}`eq-ccq-ilp`):

$$\min \sum_{s,o} t_{s,o} x_{s,o} + \sum_{k,c,a} \omega_{k,c,a} y_{k,c,a}
\quad\text{s.t.}\quad \sum_o x_{s,o} = 1,\ \ \sum_a y_{k,c,a} = x_{k,c},\ \
\sum_c y_{k,c,a} = x_{g(k),a},\ \ \sum_{s,o} \Delta_{s,o} x_{s,o} \le \varepsilon .$$

The dual form swaps objective and constraint (least sensitivity under a latency cap).
:func:`solve` uses :func:`scipy.optimize.milp` (HiGHS); :func:`solve_pulp` builds the same
program for PuLP's CBC, and :func:`brute_force` enumerates every configuration.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from icml26.cocoquant.cost import (
    Deployment,
    HardwareProfile,
    conversion_time,
    fixed_time,
    site_time,
)
from icml26.cocoquant.tp import consumer, site_kind, site_names, site_options
from icml26.core import check_count


@dataclass
class AllocationProblem:
    """Sites, options, per-option latency and sensitivity, and alignment pair costs.

    ``pairs`` maps a communication site to its consumer GEMM site, and
    ``pair_cost[k][i, j]`` is the extra time when site ``k`` takes its option ``i`` and the
    consumer its option ``j``. ``constant`` is time no decision changes.
    """

    sites: list[str]
    options: dict[str, tuple[str, ...]]
    latency: dict[str, np.ndarray]
    sensitivity: dict[str, np.ndarray]
    pairs: dict[str, str]
    pair_cost: dict[str, np.ndarray]
    constant: float = 0.0

    def latency_of(self, config: dict[str, str]) -> float:
        """Predicted latency of a configuration."""
        idx = self._index(config)
        total = self.constant + sum(self.latency[s][idx[s]] for s in self.sites)
        return float(total + sum(self.pair_cost[k][idx[k], idx[g]] for k, g in self.pairs.items()))

    def sensitivity_of(self, config: dict[str, str]) -> float:
        """Sum of the calibrated sensitivities of a configuration (the additive prediction)."""
        idx = self._index(config)
        return float(sum(self.sensitivity[s][idx[s]] for s in self.sites))

    def _index(self, config):
        try:
            return {s: self.options[s].index(config[s]) for s in self.sites}
        except (KeyError, ValueError) as error:
            raise ValueError(f"config does not fit the problem: {error}") from None


def build_problem(sensitivity: dict[tuple[str, str], float], shape: Deployment,
                  hw: HardwareProfile, sites: list[str] | None = None,
                  aligned: bool = True) -> AllocationProblem:
    """The allocation problem of a model with ``shape.n_layers`` layers on hardware ``hw``.

    ``sensitivity[(site, option)]`` is the calibrated cost of running ``site`` at ``option``
    alone (missing entries, such as the reference options, count as 0). ``sites`` restricts the
    decision to a subset; the others stay at their reference precision. ``aligned=False`` prices
    every quantised message as if the precision-aligned rewrite were not available
    ({eq}`eq-ccq-align`, the ablation).
    """
    every = site_names(shape.n_layers)
    sites = every if sites is None else list(sites)
    unknown = [s for s in sites if s not in every]
    if unknown:
        raise ValueError(f"unknown sites {unknown}")
    unknown_keys = [k for k in sensitivity if k[0] not in every or k[1] not in site_options(k[0])]
    if unknown_keys:
        raise ValueError(f"sensitivities for unknown sites or precisions: {unknown_keys}")
    options = {s: site_options(s) for s in every}
    latency = {s: np.array([site_time(s, o, shape, hw) for o in options[s]]) for s in every}
    sens = {s: np.array([float(sensitivity.get((s, o), 0.0)) for o in options[s]])
            for s in every}
    pairs, pair_cost = {}, {}
    constant = fixed_time(shape, hw)
    for k in every:
        if site_kind(k) != "comm":
            continue
        g = consumer(k, shape.n_layers)
        if g is None or g not in sites:
            g_option = None if g is None else options[g][0]
            latency[k] = latency[k] + np.array(
                [conversion_time(shape, c, g_option, hw, aligned) for c in options[k]])
            continue
        if k not in sites:
            latency[g] = latency[g] + np.array(
                [conversion_time(shape, options[k][0], a, hw, aligned) for a in options[g]])
            continue
        pairs[k] = g
        pair_cost[k] = np.array([[conversion_time(shape, c, a, hw, aligned) for a in options[g]]
                                 for c in options[k]])
    for s in every:
        if s not in sites:
            constant += latency[s][0]
    return AllocationProblem(sites, {s: options[s] for s in sites},
                             {s: latency[s] for s in sites}, {s: sens[s] for s in sites},
                             pairs, pair_cost, constant)


@dataclass
class Allocation:
    """A solved allocation: the chosen option per site and its predicted numbers."""

    config: dict[str, str]
    latency: float
    sensitivity: float
    solver: str


def _check_mode(budget, latency_cap):
    if (budget is None) == (latency_cap is None):
        raise ValueError("give exactly one of budget (sensitivity) or latency_cap")


def _layout(problem: AllocationProblem):
    offset, x_index = 0, {}
    for s in problem.sites:
        x_index[s] = offset + np.arange(len(problem.options[s]))
        offset += len(problem.options[s])
    y_index = {}
    for k, g in problem.pairs.items():
        n_k, n_g = len(problem.options[k]), len(problem.options[g])
        y_index[k] = offset + np.arange(n_k * n_g).reshape(n_k, n_g)
        offset += n_k * n_g
    return x_index, y_index, offset


def _vectors(problem: AllocationProblem):
    x_index, y_index, n = _layout(problem)
    t, d = np.zeros(n), np.zeros(n)
    for s in problem.sites:
        t[x_index[s]] = problem.latency[s]
        d[x_index[s]] = problem.sensitivity[s]
    for k in problem.pairs:
        t[y_index[k].ravel()] = problem.pair_cost[k].ravel()
    rows, rhs = [], []
    for s in problem.sites:
        row = np.zeros(n)
        row[x_index[s]] = 1
        rows.append(row)
        rhs.append(1.0)
    for k, g in problem.pairs.items():
        for i in range(len(problem.options[k])):
            row = np.zeros(n)
            row[y_index[k][i, :]] = 1
            row[x_index[k][i]] = -1
            rows.append(row)
            rhs.append(0.0)
        for j in range(len(problem.options[g])):
            row = np.zeros(n)
            row[y_index[k][:, j]] = 1
            row[x_index[g][j]] = -1
            rows.append(row)
            rhs.append(0.0)
    return x_index, t, d, np.array(rows), np.array(rhs)


def _decode(problem, x_index, values) -> dict[str, str]:
    return {s: problem.options[s][int(np.argmax(values[x_index[s]]))] for s in problem.sites}


def _infeasible(problem, budget, latency_cap):
    if budget is not None:
        least = sum(float(problem.sensitivity[s].min()) for s in problem.sites)
        return ValueError(f"infeasible: no configuration keeps the summed sensitivity within "
                          f"the budget {budget:.6g}; the least sensitive configuration has "
                          f"{least:.6g}")
    fastest = solve(problem, budget=np.inf).latency
    return ValueError(f"infeasible: no configuration meets the latency cap {latency_cap:.6g} s; "
                      f"the fastest configuration needs {fastest:.6g} s")


def _finish(problem, config, solver):
    return Allocation(config, problem.latency_of(config), problem.sensitivity_of(config), solver)


def solve(problem: AllocationProblem, budget: float | None = None,
          latency_cap: float | None = None) -> Allocation:
    """Optimal allocation with :func:`scipy.optimize.milp` ({eq}`eq-ccq-ilp`).

    With ``budget``: least latency with summed sensitivity at most ``budget``. With
    ``latency_cap``: least summed sensitivity with latency at most the cap (ties go to the
    faster configuration). An infeasible request raises ``ValueError`` saying why.
    """
    _check_mode(budget, latency_cap)
    x_index, t, d, A, b = _vectors(problem)
    constraints = [LinearConstraint(A, b, b)]
    if budget is not None:
        objective = t
        if np.isfinite(budget):
            constraints.append(LinearConstraint(d[None, :], -np.inf, float(budget)))
    else:
        scale = max(float(np.abs(d).max()), 1e-12) * 1e-9 / max(float(t.max()), 1e-12)
        objective = d + scale * t  # lexicographic tie-break toward the faster option
        constraints.append(LinearConstraint(t[None, :], -np.inf,
                                            float(latency_cap) - problem.constant))
    result = milp(objective / max(float(np.abs(objective).max()), 1e-300),
                  constraints=constraints, integrality=np.ones(len(t)), bounds=Bounds(0, 1),
                  options={"mip_rel_gap": 0.0})
    if result.status == 2 or result.x is None:
        raise _infeasible(problem, budget, latency_cap)
    if result.status != 0:
        raise RuntimeError(f"milp did not finish: {result.message}")
    return _finish(problem, _decode(problem, x_index, result.x), "scipy.milp")


def solve_pulp(problem: AllocationProblem, budget: float | None = None,
               latency_cap: float | None = None) -> Allocation:
    """The same program solved by PuLP's bundled CBC (an independent solver)."""
    import pulp

    _check_mode(budget, latency_cap)
    x_index, t, d, A, b = _vectors(problem)
    t_unit = max(float(np.abs(t).max()), 1e-300)  # CBC's tolerances are absolute: rescale
    d_unit = max(float(np.abs(d).max()), 1e-300)
    t, d = t / t_unit, d / d_unit
    if budget is not None:
        budget = budget / d_unit
    else:
        latency_cap = problem.constant + (latency_cap - problem.constant) / t_unit
    model = pulp.LpProblem("allocation", pulp.LpMinimize)
    x = [pulp.LpVariable(f"x{i}", cat="Binary") for i in range(len(t))]
    if budget is not None:
        model += pulp.lpDot(t.tolist(), x)
        model += pulp.lpDot(d.tolist(), x) <= float(budget)
    else:
        model += pulp.lpDot(d.tolist(), x)
        model += pulp.lpDot(t.tolist(), x) <= float(latency_cap) - problem.constant
    for row, value in zip(A, b, strict=True):
        nz = np.flatnonzero(row)
        model += pulp.lpSum(float(row[i]) * x[i] for i in nz) == float(value)
    status = model.solve(pulp.PULP_CBC_CMD(msg=False, gapRel=0.0, gapAbs=0.0))
    if pulp.LpStatus[status] != "Optimal":
        raise _infeasible(problem, budget, latency_cap)
    values = np.array([v.value() for v in x])
    return _finish(problem, _decode(problem, x_index, values), "pulp.cbc")


def _enumerate(problem: AllocationProblem, max_configs: int):
    """Latency and summed sensitivity of every configuration, as arrays over the option grid."""
    sizes = [len(problem.options[s]) for s in problem.sites]
    count = int(np.prod(sizes))
    if count > max_configs:
        raise ValueError(f"{count} configurations exceed max_configs = {max_configs}")
    axis = {s: i for i, s in enumerate(problem.sites)}
    n = len(sizes)

    def along(values, *axes):
        shape = [1] * n
        for a, size in zip(axes, values.shape, strict=True):
            shape[a] = size
        return values.reshape(shape)

    latency = np.full(sizes, problem.constant)
    sens = np.zeros(sizes)
    for s in problem.sites:
        latency = latency + along(problem.latency[s], axis[s])
        sens = sens + along(problem.sensitivity[s], axis[s])
    for k, g in problem.pairs.items():
        table = problem.pair_cost[k]
        if axis[k] > axis[g]:
            table = table.T
        latency = latency + along(table, *sorted((axis[k], axis[g])))
    return latency, sens, sizes


def _config_at(problem: AllocationProblem, flat: int, sizes) -> dict[str, str]:
    index = np.unravel_index(flat, sizes)
    return {s: problem.options[s][i] for s, i in zip(problem.sites, index, strict=True)}


def brute_force(problem: AllocationProblem, budget: float | None = None,
                latency_cap: float | None = None, max_configs: int = 10_000_000) -> Allocation:
    """Enumerate every configuration (vectorised); for checking the solvers."""
    _check_mode(budget, latency_cap)
    latency, sens, sizes = _enumerate(problem, max_configs)
    if budget is not None:
        score = np.where(sens <= budget + 1e-12, latency, np.inf)
    else:
        score = np.where(latency <= latency_cap + 1e-15, sens, np.inf)
    if not np.isfinite(score).any():
        raise _infeasible(problem, budget, latency_cap)
    best = score.min()
    ties = np.flatnonzero(score.ravel() <= best + 1e-15 * max(1.0, abs(best)))
    flat = ties[np.argmin(latency.ravel()[ties])] if latency_cap is not None else ties[0]
    return _finish(problem, _config_at(problem, flat, sizes), "brute force")


def random_allocations(problem: AllocationProblem, latency_cap: float, count: int,
                       rng: np.random.Generator, slack: float = 0.05,
                       max_configs: int = 10_000_000) -> list[Allocation]:
    """``count`` configurations drawn uniformly from those with latency in
    ``[(1 - slack) * latency_cap, latency_cap]``: random allocations that use the same time
    budget as an optimised one, blind to every sensitivity (the baseline of the claims)."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator, got {type(rng).__name__}")
    if not 0 < slack < 1:
        raise ValueError(f"slack must lie in (0, 1), got {slack}")
    latency, _, sizes = _enumerate(problem, max_configs)
    window = np.flatnonzero((latency.ravel() <= latency_cap * (1 + 1e-12))
                            & (latency.ravel() >= (1 - slack) * latency_cap))
    if window.size == 0:
        raise ValueError(f"no configuration has a latency within {slack:.0%} below the cap "
                         f"{latency_cap:.6g} s")
    picks = rng.choice(window, size=check_count(count, "count", 1), replace=True)
    return [_finish(problem, _config_at(problem, int(flat), sizes), "random") for flat in picks]


def full_config(problem_config: dict[str, str], n_layers: int) -> dict[str, str]:
    """Complete a (sub-)problem's configuration with the reference precision elsewhere."""
    return {s: problem_config.get(s, site_options(s)[0]) for s in site_names(n_layers)}


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points not dominated in (latency, loss), both to be minimised, by latency."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    front, best = [], np.inf
    for i in order:
        if points[i][1] < best:
            front.append(i)
            best = points[i][1]
    return front


def all_configs(problem: AllocationProblem):
    """Iterate over every configuration of a (small) problem."""
    for choice in itertools.product(*(problem.options[s] for s in problem.sites)):
        yield dict(zip(problem.sites, choice, strict=True))
