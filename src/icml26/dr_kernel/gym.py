"""A mini kernel gym on the CPU: real candidates, correctness, profiling and a cost model.

A :class:`Task` is a small tensor program written op by op (the "PyTorch reference"); a
:class:`Candidate` is an implementation of it that declares its own "kernels" (the functions it
claims do the work). :func:`evaluate` runs a candidate for real:

1. **correctness**: ``allclose`` against the reference on fresh random inputs; a candidate that
   raises or returns the wrong shape or type is a failure with a message, never a crash;
2. **hacking check**: one run on fresh inputs under :mod:`cProfile`; every declared kernel must
   appear among the functions that executed, otherwise the candidate is flagged;
3. **coverage**: every ATen operator that executed is logged by a ``TorchDispatchMode`` and
   attributed to a declared kernel if one is on the Python call stack; coverage is the share of
   the modelled cost inside the kernels (the CPU analogue of KernelGYM's profiled kernel time);
4. **speed**: a deterministic :class:`CostModel` (launch overhead + bytes + flops per operator).
   The *honest* speed-up prices one call on fresh inputs; the *naive timer* prices a timing loop
   that re-uses one input, which a caching decoy fools. Wall-clock times are measured separately,
   for a figure only.
"""

from __future__ import annotations

import cProfile
import math
import pstats
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.nn import functional as F  # noqa: N812
from torch.utils._python_dispatch import TorchDispatchMode

from icml26.dr_kernel.bandit import STRATEGIES, Outcomes

_MATMUL_OPS = {"mm", "addmm", "bmm", "baddbmm", "matmul"}


@dataclass(frozen=True)
class CostModel:
    """Modelled cost of one ATen operator in microseconds: launch + bytes / B + flops / F.

    View operators (no data moved) cost nothing. A call of a candidate adds ``call_overhead``.
    """

    launch_us: float = 4.0
    bytes_per_us: float = 2.0e4  # 20 GB/s
    flops_per_us: float = 2.0e5  # 200 GFLOP/s
    call_overhead_us: float = 1.0

    def op_cost(self, func, args, kwargs, out) -> float:
        if getattr(func, "is_view", False):
            return 0.0
        tensors = [a for a in _flatten((args, kwargs)) if isinstance(a, torch.Tensor)]
        outs = [o for o in _flatten(out) if isinstance(o, torch.Tensor)]
        moved = sum(t.numel() * t.element_size() for t in tensors + outs)
        name = func._schema.name.split("::")[-1]
        if name in _MATMUL_OPS and len(tensors) >= 2:
            a, b = tensors[-2], tensors[-1]
            flops = 2.0 * a.shape[-2] * a.shape[-1] * b.shape[-1] * max(1, a.numel() //
                                                                       max(1, a.shape[-2] *
                                                                           a.shape[-1]))
        else:
            flops = float(sum(o.numel() for o in outs))
        return self.launch_us + moved / self.bytes_per_us + flops / self.flops_per_us


def _flatten(obj):
    if isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _flatten(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _flatten(item)
    else:
        yield obj


@dataclass(frozen=True)
class OpRecord:
    """One executed ATen operator: its name, modelled cost and whether a declared kernel ran it."""

    name: str
    cost: float
    in_kernel: bool


class OpLogger(TorchDispatchMode):
    """Log every ATen operator with its modelled cost and kernel attribution (a stack walk)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ to keep torch.compile out of it, which imports
        # torch._dynamo (seconds) on first use. Nothing is compiled under this mode: no wrapper.
        return False

    def __init__(self, cost_model: CostModel, kernel_codes=frozenset()):
        super().__init__()
        self.cost_model = cost_model
        self.kernel_codes = frozenset(kernel_codes)
        self.records: list[OpRecord] = []

    def _inside_kernel(self) -> bool:
        if not self.kernel_codes:
            return False
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_code in self.kernel_codes:
                return True
            frame = frame.f_back
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        cost = self.cost_model.op_cost(func, args, kwargs, out)
        self.records.append(OpRecord(func._schema.name.split("::")[-1], cost,
                                     self._inside_kernel()))
        return out

    @property
    def total(self) -> float:
        return float(sum(r.cost for r in self.records))


@dataclass(frozen=True)
class Task:
    """A small tensor program: an op-by-op reference and a generator of fresh inputs."""

    name: str
    reference: Callable
    make_inputs: Callable[[torch.Generator], tuple]


@dataclass(frozen=True)
class Candidate:
    """One implementation of a task with the kernels it declares (possibly never called)."""

    task: str
    strategy: str
    label: str
    forward: Callable
    kernels: tuple[Callable, ...] = ()

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if not callable(self.forward) or not all(callable(k) for k in self.kernels):
            raise TypeError("forward and every kernel must be callable")


@dataclass(frozen=True)
class Evaluation:
    """What the gym reports for one candidate on one draw of inputs."""

    task: str
    label: str
    strategy: str
    correct: bool
    error: str | None
    hacked: bool
    kernels_executed: int
    kernels_declared: int
    coverage: float
    speedup: float  # honest: cost model, one call on fresh inputs
    timer_speedup: float  # naive timer: cost model over a loop that re-uses one input
    ops: int = 0
    wall_speedup: float = math.nan
    notes: dict = field(default_factory=dict)


def _code_key(code) -> tuple[str, int, str]:
    return (code.co_filename, code.co_firstlineno, code.co_name)


def _check_output(out, expected) -> str | None:
    if not isinstance(out, torch.Tensor):
        return f"returned {type(out).__name__}, not a tensor"
    if out.shape != expected.shape:
        return f"returned shape {tuple(out.shape)}, expected {tuple(expected.shape)}"
    if out.dtype != expected.dtype:
        return f"returned dtype {out.dtype}, expected {expected.dtype}"
    if not torch.allclose(out, expected, rtol=1e-4, atol=1e-5):
        err = (out - expected).abs().max().item()
        return f"wrong values (max abs error {err:.3g})"
    return None


def _cost_of_calls(fn, inputs, cost_model, calls: int) -> tuple[float, int]:
    with OpLogger(cost_model) as log:
        for _ in range(calls):
            fn(*inputs)
    return log.total / calls + cost_model.call_overhead_us, len(log.records) // calls


def evaluate(candidate: Candidate, task: Task, generator: torch.Generator, *, trials: int = 3,
             timing_calls: int = 3, cost_model: CostModel | None = None,
             wall_repeats: int = 0) -> Evaluation:
    """Run ``candidate`` for real: correctness, profiling check, coverage and modelled speed-up.

    Never raises because of the candidate: an exception or a wrong output is reported as
    ``correct=False`` with the message in ``error`` (and zero speed-up).
    """
    if not isinstance(candidate, Candidate) or not isinstance(task, Task):
        raise TypeError("evaluate needs a Candidate and a Task")
    if candidate.task != task.name:
        raise ValueError(f"candidate {candidate.label!r} is for task {candidate.task!r}, "
                         f"not {task.name!r}")
    if trials < 1 or timing_calls < 1:
        raise ValueError("trials and timing_calls must be at least 1")
    cost_model = cost_model or CostModel()
    declared = len(candidate.kernels)

    def failure(message: str) -> Evaluation:
        return Evaluation(task.name, candidate.label, candidate.strategy, False, message,
                          False, 0, declared, 0.0, 0.0, 0.0)

    # 1. correctness on fresh random inputs
    for _ in range(trials):
        inputs = task.make_inputs(generator)
        expected = task.reference(*inputs)
        try:
            out = candidate.forward(*inputs)
        except Exception as error:  # a failing candidate is a reward, not a crash
            return failure(f"raised {type(error).__name__}: {error}")
        message = _check_output(out, expected)
        if message is not None:
            return failure(message)

    # 2-3. one profiled run on fresh inputs: what executed, and where the cost went
    inputs = task.make_inputs(generator)
    codes = frozenset(k.__code__ for k in candidate.kernels)
    profiler = cProfile.Profile()
    try:
        with OpLogger(cost_model, codes) as log:
            profiler.enable()
            try:
                candidate.forward(*inputs)
            finally:
                profiler.disable()
    except Exception as error:
        return failure(f"raised {type(error).__name__} while profiled: {error}")
    called = {key: stat[1] for key, stat in pstats.Stats(profiler).stats.items()}
    executed = sum(called.get(_code_key(k.__code__), 0) > 0 for k in candidate.kernels)
    hacked = declared == 0 or executed < declared
    honest_cost = log.total + cost_model.call_overhead_us
    inside = sum(r.cost for r in log.records if r.in_kernel)
    coverage = inside / log.total if log.total > 0 else 0.0
    ref_cost, _ = _cost_of_calls(task.reference, inputs, cost_model, 1)

    # 4. the naive timer: warm up once, then time a loop that re-uses the same input
    timed = task.make_inputs(generator)
    candidate.forward(*timed)
    timer_cost, _ = _cost_of_calls(candidate.forward, timed, cost_model, timing_calls)
    wall = math.nan
    if wall_repeats > 0:
        wall = wall_time(task.reference, task.make_inputs, generator, wall_repeats) / wall_time(
            candidate.forward, task.make_inputs, generator, wall_repeats)
    return Evaluation(task.name, candidate.label, candidate.strategy, True, None, hacked,
                      executed, declared, float(coverage), float(ref_cost / honest_cost),
                      float(ref_cost / timer_cost), len(log.records), wall)


def wall_time(fn, make_inputs, generator, repeats: int) -> float:
    """Median wall-clock seconds of one call on fresh inputs (for a figure, never a claim)."""
    times = []
    for _ in range(repeats):
        inputs = make_inputs(generator)
        start = time.perf_counter()
        fn(*inputs)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


# --- The tasks and their candidates -------------------------------------------------------------

BATCH, WIDTH = 256, 64


def _mlp_inputs(g):
    x = torch.randn(BATCH, WIDTH, generator=g)
    W = torch.randn(WIDTH, WIDTH, generator=g) / WIDTH**0.5
    b = torch.randn(WIDTH, generator=g)
    s = 0.5 + torch.rand((), generator=g)
    return x, W, b, s


def _mlp_reference(x, W, b, s):
    z = x @ W
    z = z + b
    z = torch.relu(z)
    return z * s


def _norm_inputs(g):
    x = torch.randn(BATCH, WIDTH, generator=g) * 2 + 1
    gamma = 1 + 0.1 * torch.randn(WIDTH, generator=g)
    beta = 0.1 * torch.randn(WIDTH, generator=g)
    return x, gamma, beta


def _norm_reference(x, gamma, beta):
    mean = x.mean(-1, keepdim=True)
    centred = x - mean
    var = (centred * centred).mean(-1, keepdim=True)
    y = centred / torch.sqrt(var + 1e-5)
    return y * gamma + beta


def _softmax_inputs(g):
    return (torch.randn(BATCH, WIDTH, generator=g) * 3,)


def _softmax_reference(x):
    m = x.amax(-1, keepdim=True)
    e = torch.exp(x - m)
    return e / e.sum(-1, keepdim=True)


def _gelu_inputs(g):
    return (torch.randn(BATCH, WIDTH, generator=g),)


def _gelu_reference(x):
    inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)
    return 0.5 * x * (1 + torch.tanh(inner))


TASKS = {
    "linear_relu_scale": Task("linear_relu_scale", _mlp_reference, _mlp_inputs),
    "layer_norm": Task("layer_norm", _norm_reference, _norm_inputs),
    "softmax": Task("softmax", _softmax_reference, _softmax_inputs),
    "gelu_tanh": Task("gelu_tanh", _gelu_reference, _gelu_inputs),
}
"""The mini gym's tasks: small programs written op by op, as KernelBench references are."""


# Kernels: plain functions a candidate declares as its own. Fused ones call a fused primitive.

def scale_kernel(z, s):
    return z * s


def bias_relu_kernel(z, b):
    return torch.relu(z + b)


def fused_linear_kernel(x, W, b, s):
    return torch.addmm(b, x, W, beta=float(s), alpha=float(s)).relu_()


def fused_linear_inplace_kernel(x, W, b, s):
    return torch.addmm(b, x, W).relu_().mul_(s)


def buggy_linear_kernel(x, W, b, s):
    return torch.addmm(b, x, W.T[:, :-1]).relu_().mul_(s)  # slices the wrong axis: raises


def nobias_linear_kernel(x, W, b, s):
    return (x @ W).relu_().mul_(s)  # forgets the bias: wrong values


def affine_kernel(y, gamma, beta):
    return torch.addcmul(beta, y, gamma)


def fused_norm_kernel(x, gamma, beta):
    return F.layer_norm(x, (x.shape[-1],), gamma, beta, 1e-5)


def wrongeps_norm_kernel(x, gamma, beta):
    return F.layer_norm(x, (x.shape[-1],), gamma, beta, 1.0)  # wrong epsilon: wrong values


def rownorm_kernel(x, gamma, beta):
    return F.layer_norm(x.T, (x.shape[0],)).T.contiguous()  # normalises the wrong axis


def divide_kernel(e, total):
    return e / total


def fused_softmax_kernel(x):
    return torch.softmax(x, dim=-1)


def colsoftmax_kernel(x):
    return torch.softmax(x, dim=0)  # wrong axis: wrong values


def reduced_softmax_kernel(x):
    return torch.logsumexp(x, dim=-1)  # returns the wrong shape


def tanh_kernel(inner):
    return torch.tanh(inner)


def fused_gelu_kernel(x):
    return F.gelu(x, approximate="tanh")


def erf_gelu_kernel(x):
    return F.gelu(x)  # the exact GELU, not the tanh form: values differ by about 1e-3


def typo_gelu_kernel(x):
    return F.gelu(x, approximate="tanh_")  # an invalid argument: raises


def _lazy_mlp(x, W, b, s):
    z = x @ W
    z = z + b
    z = torch.relu(z)
    return scale_kernel(z, s)


def _lazy_mlp_bias(x, W, b, s):
    return bias_relu_kernel(x @ W, b) * s


def _lazy_norm(x, gamma, beta):
    mean = x.mean(-1, keepdim=True)
    centred = x - mean
    var = (centred * centred).mean(-1, keepdim=True)
    return affine_kernel(centred / torch.sqrt(var + 1e-5), gamma, beta)


def _lazy_softmax(x):
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return divide_kernel(e, e.sum(-1, keepdim=True))


def _lazy_gelu(x):
    inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)
    return 0.5 * x * (1 + tanh_kernel(inner))


def _decoy(reference, kernel):
    """A decoy: declares a fast kernel, never calls it, runs the reference and caches its output
    for a repeated input (the loophole a timing loop that re-uses its input leaves open)."""
    cache = {}

    def forward(*inputs):
        key = tuple(id(t) for t in inputs)
        if cache.get("key") == key:
            return cache["out"]
        out = reference(*inputs)
        cache.update(key=key, out=out)
        return out

    forward.unused_kernel = kernel  # defined, shipped, never launched
    return forward


def _fwd(kernel):
    def forward(*inputs):
        return kernel(*inputs)

    return forward


def make_candidates() -> list[Candidate]:
    """Every candidate of every task: lazy edits, fusion attempts (some buggy) and a decoy."""
    c = []
    for task, lazy, fused, bad, decoy_kernel in (
        ("linear_relu_scale", [(_lazy_mlp, scale_kernel), (_lazy_mlp_bias, bias_relu_kernel)],
         [fused_linear_kernel, fused_linear_inplace_kernel],
         [buggy_linear_kernel, nobias_linear_kernel], fused_linear_kernel),
        ("layer_norm", [(_lazy_norm, affine_kernel)], [fused_norm_kernel],
         [wrongeps_norm_kernel, rownorm_kernel], fused_norm_kernel),
        ("softmax", [(_lazy_softmax, divide_kernel)], [fused_softmax_kernel],
         [colsoftmax_kernel, reduced_softmax_kernel], fused_softmax_kernel),
        ("gelu_tanh", [(_lazy_gelu, tanh_kernel)], [fused_gelu_kernel],
         [erf_gelu_kernel, typo_gelu_kernel], fused_gelu_kernel),
    ):
        for fn, kernel in lazy:
            c.append(Candidate(task, "lazy", f"{task}/lazy:{kernel.__name__}", fn, (kernel,)))
        for kernel in fused + bad:
            c.append(Candidate(task, "fuse", f"{task}/fuse:{kernel.__name__}", _fwd(kernel),
                               (kernel,)))
        c.append(Candidate(task, "decoy", f"{task}/decoy", _decoy(TASKS[task].reference,
                                                                   decoy_kernel),
                           (decoy_kernel,)))
    return c


@dataclass(frozen=True)
class GymTable:
    """Evaluations of every candidate on several input draws: the reward table of the learner."""

    evaluations: tuple[Evaluation, ...]

    def by_strategy(self, strategy: str) -> list[Evaluation]:
        return [e for e in self.evaluations if e.strategy == strategy]

    def outcomes(self, choice: np.ndarray, rng: np.random.Generator) -> Outcomes:
        """An environment for :func:`icml26.dr_kernel.bandit.train_policy`: for each chosen
        strategy, one of its recorded evaluations at random (a random task, candidate and draw)."""
        columns = self._columns()
        choice = np.asarray(choice)
        index = np.empty(choice.shape, dtype=int)
        for k, rows in enumerate(columns["rows"]):
            chosen = choice == k
            index[chosen] = rows[rng.integers(len(rows), size=int(chosen.sum()))]
        return Outcomes(correct=columns["correct"][index],
                        measured_speedup=columns["timer"][index],
                        true_speedup=columns["speedup"][index],
                        coverage=columns["coverage"][index], hacked=columns["hacked"][index])

    def _columns(self) -> dict:
        cached = self.__dict__.get("_cache")
        if cached is None:
            ev = self.evaluations
            cached = {"rows": [np.array([i for i, e in enumerate(ev) if e.strategy == s])
                               for s in STRATEGIES],
                      "correct": np.array([e.correct for e in ev]),
                      "timer": np.array([e.timer_speedup for e in ev]),
                      "speedup": np.array([e.speedup for e in ev]),
                      "coverage": np.array([e.coverage for e in ev]),
                      "hacked": np.array([e.correct and e.hacked for e in ev])}
            object.__setattr__(self, "_cache", cached)
        return cached


def build_table(draws: int, seed: int, *, wall_repeats: int = 0) -> GymTable:
    """Evaluate every candidate ``draws`` times with fresh inputs from one seeded generator."""
    generator = torch.Generator().manual_seed(seed)
    evaluations = []
    for _ in range(draws):
        for cand in make_candidates():
            evaluations.append(evaluate(cand, TASKS[cand.task], generator,
                                        wall_repeats=wall_repeats))
    return GymTable(tuple(evaluations))


@dataclass(frozen=True)
class TestTimeScaling:
    """Sequential test-time scaling on a :class:`GymTable` (:func:`sequential_scaling`).

    ``last[e, t]`` says whether the candidate of turn ``t + 1`` of episode ``e`` is fast (correct,
    not a hack, true speed-up at least 1.2); ``best[name][e, t]`` whether the candidate with the
    highest reward among the first ``t + 1`` turns, under the reward pipeline ``name``, is fast.
    """

    last: np.ndarray
    best: dict

    def last_rate(self) -> np.ndarray:
        return self.last.mean(0)

    def best_rate(self, name: str) -> np.ndarray:
        return self.best[name].mean(0)


def sequential_scaling(table: GymTable, configs: dict, *, turns: int, episodes: int,
                       rng: np.random.Generator, policy=(1 / 3, 1 / 3, 1 / 3),
                       fast: float = 1.2) -> TestTimeScaling:
    """Sequential refinement on the gym, scored at the last turn and by best-of-turns selection.

    Each episode draws a task. At every turn the policy draws a strategy, then one candidate of
    that task and strategy uniformly among those not yet seen to fail the correctness check (the
    feedback of earlier turns; if none is left, any candidate of the task not seen to fail, and if
    every candidate of the task has failed, any candidate of the task), and one recorded
    evaluation of it. Selection picks the turn of highest reward (Eq.
    ``eq-drk-reward``) under each :class:`~icml26.dr_kernel.bandit.RewardConfig` of ``configs``,
    on the same turns, so the pipelines are compared on identical episodes.
    """
    from icml26.dr_kernel.bandit import RewardConfig, kernel_reward

    if not isinstance(table, GymTable):
        raise TypeError("table must be a GymTable")
    if not configs or not all(isinstance(c, RewardConfig) for c in configs.values()):
        raise TypeError("configs must map names to RewardConfig objects")
    for value, name in ((turns, "turns"), (episodes, "episodes")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    policy = np.asarray(policy, dtype=float)
    if policy.shape != (len(STRATEGIES),) or np.any(policy < 0) or not np.isclose(policy.sum(), 1):
        raise ValueError(f"policy must be a probability vector over {STRATEGIES}")
    ev = table.evaluations
    labels = sorted({e.label for e in ev})
    tasks = sorted({e.task for e in ev})
    draws = {label: [i for i, e in enumerate(ev) if e.label == label] for label in labels}
    n_draws = min(len(v) for v in draws.values())
    index = np.array([draws[label][:n_draws] for label in labels])  # (candidates, draws)
    first = [ev[draws[label][0]] for label in labels]
    cand_task = np.array([tasks.index(e.task) for e in first])
    cand_strategy = np.array([STRATEGIES.index(e.strategy) for e in first])
    columns = table._columns()

    task = rng.integers(len(tasks), size=episodes)
    failed = np.zeros((episodes, len(labels)), dtype=bool)
    chosen = np.empty((episodes, turns), dtype=int)
    for t in range(turns):
        strategy = np.minimum((rng.random((episodes, 1)) > np.cumsum(policy)).sum(1),
                              len(STRATEGIES) - 1)
        any_of_task = cand_task[None, :] == task[:, None]
        of_task = any_of_task & ~failed
        allowed = of_task & (cand_strategy[None, :] == strategy[:, None])
        allowed = np.where(allowed.any(1, keepdims=True), allowed, of_task)
        allowed = np.where(allowed.any(1, keepdims=True), allowed, any_of_task)
        pick = np.argmax(rng.random(allowed.shape) * allowed, 1)
        row = index[pick, rng.integers(n_draws, size=episodes)]
        chosen[:, t] = row
        failed[np.arange(episodes), pick] |= ~columns["correct"][row]
    outcomes = Outcomes(correct=columns["correct"][chosen],
                        measured_speedup=columns["timer"][chosen],
                        true_speedup=columns["speedup"][chosen],
                        coverage=columns["coverage"][chosen], hacked=columns["hacked"][chosen])
    is_fast = outcomes.correct & ~outcomes.hacked & (outcomes.true_speedup >= fast)
    best = {}
    for name, config in configs.items():
        reward = kernel_reward(outcomes, config)
        # best of the first t + 1 turns; argmax takes the first turn that reaches the maximum
        pick = np.stack([np.argmax(reward[:, :t + 1], 1) for t in range(turns)], 1)
        best[name] = np.take_along_axis(is_fast, pick, 1)
    return TestTimeScaling(is_fast, best)
