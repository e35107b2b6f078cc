"""Quantising a whole :class:`icml26.nn.TinyGPT`: initialisation, QAT, and the measurements.

Every Linear layer inside the transformer blocks is quantised; embeddings, LayerNorms and the
output head stay in floating point (our choice; the sources we read do not say what the paper
does). The QAT methods differ only in how the quantised layers are trained:

* ``"independent"``: one latent per path (standard residual-binarization QAT);
* ``"freeze"``: the same, with path 1 frozen at its initialisation (the path-freezing heuristic);
* ``"rabit"``: one shared latent, paths derived sequentially (RaBiT);
* ``"lsq"``: a uniform 4-level (2-bit) grid per output row with a learned step (LSQ), no paths.

All three start from the same binary paths, hence from exactly the same function, and train with
the same distillation loss, optimizer, schedule, steps and batches.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from icml26 import nn as tnn
from icml26.rabit.binarize import (
    BinaryPaths,
    ResidualBinaryLinear,
    UniformQATLinear,
    function_aware_init,
    residual_svid,
    rtn_quantize,
)
from icml26.rabit.packed import bits_per_weight

METHODS = ("independent", "freeze", "rabit", "lsq")
INITS = ("function", "weight")


def initial_paths(model: nn.Module, calibration_tokens: torch.Tensor, paths: int = 2,
                  rounds: int = 2, init: str = "function") -> dict[str, BinaryPaths]:
    """Binary paths for every block Linear of ``model``.

    ``init="function"`` uses :func:`function_aware_init` on the layer's calibration inputs;
    ``init="weight"`` is plain greedy residual SVID on the weight (no data).
    """
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    layers = tnn.linear_layers(model)
    inputs = tnn.record_inputs(model, calibration_tokens, layers) if init == "function" else {}
    with torch.no_grad():
        return {name: function_aware_init(layer.weight, inputs[name], paths, rounds)
                if init == "function" else residual_svid(layer.weight, paths)
                for name, layer in layers.items()}


def build_quantized(model: nn.Module, method: str,
                    paths: dict[str, BinaryPaths], ste: str = "identity") -> nn.Module:
    """A copy of ``model`` whose block Linears are :class:`ResidualBinaryLinear` layers.

    Only the quantised layers' latents, scales and biases stay trainable.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    quantized = copy.deepcopy(model)
    for parameter in quantized.parameters():
        parameter.requires_grad_(False)
    mode = "rabit" if method == "rabit" else "independent"
    frozen = 1 if method == "freeze" else 0

    def factory(name: str, linear: nn.Linear) -> nn.Module:
        if method == "lsq":
            return UniformQATLinear(linear.weight, linear.bias, bits=2)
        return ResidualBinaryLinear(linear.weight, paths[name], linear.bias, mode, frozen, ste)

    tnn.replace_linears(quantized, factory, names=list(paths))
    return quantized


def start_gap(model: nn.Module, paths: dict[str, BinaryPaths]) -> float:
    r"""Largest |entry| of $\hat W - \hat W_{\text{init}}$ over every quantised layer of
    ``model``: 0 when each layer (both modes) starts exactly from its initial paths."""
    layers = quantized_layers(model)
    if set(layers) != set(paths):
        raise ValueError("the model's quantised layers and the paths name different layers")
    with torch.no_grad():
        return max((layers[name].weight() - paths[name].weight()).abs().max().item()
                   for name in layers)


def rtn_model(model: nn.Module, bits: int = 2) -> nn.Module:
    """A copy of ``model`` with every block Linear weight round-to-nearest quantised."""
    quantized = copy.deepcopy(model)
    with torch.no_grad():
        for layer in tnn.linear_layers(quantized).values():
            layer.weight.copy_(rtn_quantize(layer.weight, bits)[0])
    return quantized


def quantized_layers(model: nn.Module) -> dict[str, ResidualBinaryLinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, ResidualBinaryLinear)}


def latent_elements(model: nn.Module) -> int:
    """Trainable latent-weight elements over all quantised layers."""
    return sum(layer.latent_elements for layer in quantized_layers(model).values())


def optimizer_state_elements(model: nn.Module) -> int:
    """Adam's state: two moments per trainable element (latents, scales and biases)."""
    return 2 * tnn.count_parameters(model)


def model_bits_per_weight(model: nn.Module, scale_bits: int = 16) -> float:
    """Bits per quantised weight over all quantised layers, scales included (Eq. `eq-bits`)."""
    layers = quantized_layers(model).values()
    if not layers:
        raise ValueError("the model has no residual binary layers")
    weights = sum(layer.out_features * layer.in_features for layer in layers)
    bits = sum(layer.out_features * layer.in_features
               * bits_per_weight(layer.out_features, layer.in_features, layer.count, scale_bits)
               for layer in layers)
    return bits / weights


def uniform_bits_per_weight(shapes, bits: int = 2, scale_bits: int = 16,
                           zero_point_bits: int = 0) -> float:
    """Bits per weight of a per-output-row uniform grid: ``bits`` per weight plus one scale (and
    an optional zero point) per row, averaged over layers of the given ``(m, n)`` shapes.

    RTN (Eq. `eq-rtn`) stores a ``scale_bits`` scale and a ``bits``-bit zero point per row; the
    symmetric LSQ grid stores the scale only.
    """
    shapes = [(int(m), int(n)) for m, n in shapes]
    if not shapes or min(min(shape) for shape in shapes) < 1 or min(bits, scale_bits) < 1 \
            or zero_point_bits < 0:
        raise ValueError("need at least one positive shape and positive bit counts")
    total = sum(m * n * bits + m * (scale_bits + zero_point_bits) for m, n in shapes)
    return total / sum(m * n for m, n in shapes)


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    """Pearson correlation of two tensors, flattened."""
    a, b = a.flatten() - a.mean(), b.flatten() - b.mean()
    return (a @ b / (a.norm() * b.norm()).clamp_min(1e-30)).item()


def path_output_correlation(model: nn.Module, tokens: torch.Tensor) -> float:
    """Mean over quantised layers of corr($\\hat W_1 x$, $\\hat W_2 x$) on the layer inputs."""
    layers = quantized_layers(model)
    inputs = tnn.record_inputs(model, tokens, layers)
    values = []
    with torch.no_grad():
        for name, layer in layers.items():
            first, second = (inputs[name] @ w.T for w in layer.path_weights()[:2])
            values.append(pearson(first, second))
    return float(np.mean(values))


@dataclass
class QATRun:
    """One QAT run: its settings, losses, validation loss and correlation trace."""

    method: str
    lr: float
    seed: int
    model: nn.Module
    losses: list[float]
    valid_nll: float
    correlation_steps: list[int] = field(default_factory=list)
    correlations: list[float] = field(default_factory=list)


def run_qat(teacher: nn.Module, method: str, paths: dict[str, BinaryPaths], train_tokens,
            valid_tokens, *, steps: int, lr: float, seed: int, batch_size: int = 32,
            min_context: int = 0, probe_tokens: torch.Tensor | None = None,
            probe_every: int = 0, ste: str = "identity") -> QATRun:
    """Quantise ``teacher`` with ``method`` and train by distillation from it.

    The loss is KL(teacher || student) on next-token distributions (:func:`icml26.nn.train`
    with AdamW, warm-up and cosine decay). With ``probe_tokens`` and ``probe_every``, the path
    output correlation is recorded every ``probe_every`` steps.
    """
    student = build_quantized(teacher, method, paths, ste)
    if method == "lsq":
        probe_tokens = None  # no paths to correlate
    steps_seen, correlations = [], []

    def probe(step: int, model: nn.Module) -> None:
        if probe_tokens is not None and probe_every and (step + 1) % probe_every == 0:
            steps_seen.append(step + 1)
            correlations.append(path_output_correlation(model, probe_tokens))

    if probe_tokens is not None and probe_every:
        steps_seen.append(0)
        correlations.append(path_output_correlation(student, probe_tokens))
    result = tnn.train(student, train_tokens, steps=steps, batch_size=batch_size, lr=lr,
                       loss=tnn.distillation_loss(teacher), seed=seed, callback=probe)
    valid = tnn.evaluate_nll(student, valid_tokens, min_context=min_context)
    return QATRun(method, lr, seed, student, result.losses, valid, steps_seen, correlations)


def sweep_learning_rate(teacher: nn.Module, method: str, paths: dict[str, BinaryPaths],
                        train_tokens, valid_tokens, lrs: Iterable[float], **kwargs) -> QATRun:
    """The run with the lowest validation loss over ``lrs`` (same seed and batches for each)."""
    runs = [run_qat(teacher, method, paths, train_tokens, valid_tokens, lr=lr, **kwargs)
            for lr in lrs]
    return min(runs, key=lambda run: run.valid_nll)


@dataclass
class Replicates:
    r"""QAT of one method on ``R`` replicates at once (:mod:`icml26.rabit.stacked`).

    ``level_skips`` and ``level_changes`` count, per replicate and over every step, the weights
    whose level index $2[b_1 > 0] + [b_2 > 0]$ changed by more than one and by any amount;
    ``flips[r, p]`` is the fraction of path $p$'s signs that differ from the start.

    ``unexplained_skips`` (RaBiT only, zeros otherwise) counts the skips that Eq. `eq-nearest`
    rules out: at entries where $G_1 > 0$ before and after the step and the latent moved by at
    most $\min(G_1^{before}, G_1^{after})$. RaBiT's level index is monotone in its latent with
    thresholds $-G_1, 0, G_1$, so a skip needs a step longer than $G_1$ (or $G_1 \le 0$) and this
    count is zero by construction; the raw skip count need not be.
    """

    method: str
    lr: float | tuple[float, ...]
    template: nn.Module
    trainable: dict[str, torch.Tensor]
    fixed: dict[str, torch.Tensor]
    losses: torch.Tensor
    level_skips: np.ndarray
    level_changes: np.ndarray
    flips: np.ndarray
    unexplained_skips: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.unexplained_skips is None:
            self.unexplained_skips = np.zeros_like(self.level_skips)

    @property
    def count(self) -> int:
        return len(self.level_skips)

    @property
    def skip_rate(self) -> np.ndarray:
        """Per replicate: the fraction of level changes that skipped a level."""
        return self.level_skips / np.maximum(self.level_changes, 1)

    def model(self, index: int) -> nn.Module:
        from icml26.rabit.stacked import replicate
        return replicate(self.template, self.trainable, index)

    def subset(self, indices) -> Replicates:
        """The replicates ``indices`` of this run (a method trained in one stack from several
        starts, e.g. two initialisations, is split back into one :class:`Replicates` per start)."""
        index = torch.as_tensor(list(indices), dtype=torch.long)
        rows = index.numpy()
        lr = self.lr if np.ndim(self.lr) == 0 else tuple(self.lr[i] for i in rows)
        return Replicates(self.method, lr, self.template,
                          {n: t[index] for n, t in self.trainable.items()},
                          {n: t[index] for n, t in self.fixed.items()}, self.losses[:, index],
                          self.level_skips[rows], self.level_changes[rows], self.flips[rows],
                          self.unexplained_skips[rows])

    def nll(self, sequences, min_context: int = 0) -> np.ndarray:
        from icml26.rabit.stacked import stacked_nll
        params = {**self.fixed, **self.trainable}
        return stacked_nll(self.template, params, sequences, min_context).numpy()


def stacked_path_signs(params: dict[str, torch.Tensor], layer: str, mode: str,
                       count: int) -> torch.Tensor:
    """Signs ``(R, P, m, n)`` of quantised layer ``layer`` from stacked parameters (Eq.
    `eq-rabit` for ``mode="rabit"``, the latents' own signs otherwise)."""
    from icml26.rabit.binarize import binary_sign
    if mode != "rabit":  # independent latents: each path is the sign of its own latent
        return torch.stack([binary_sign(params[f"{layer}.latents.{p}"]) for p in range(count)], 1)
    signs, residual = [], params[f"{layer}.latents.0"]
    for p in range(count):
        sign = binary_sign(residual)
        signs.append(sign)
        if p + 1 < count:
            scale = (params[f"{layer}.out_scales.{p}"][:, :, None]
                     * params[f"{layer}.in_scales.{p}"][:, None, :])
            residual = residual - scale * sign
    return torch.stack(signs, 1)


def qat_replicates(teacher: nn.Module | list[nn.Module], method: str,
                   paths: list[dict[str, BinaryPaths]], train_tokens, *, steps: int, lr, seeds,
                   batch_size: int = 32, ste: str = "identity", track: bool = True) -> Replicates:
    """Quantise ``teacher`` once per element of ``paths`` (one replicate each: its own
    calibration batch, hence its own initial paths) and train all replicates at once by
    distillation from ``teacher``, replicate ``r`` on the batches of ``seeds[r]``, at the rate
    ``lr`` (or ``lr[r]``, to calibrate a rate over a grid in one run).

    ``teacher`` may also be a list of full-precision models of one architecture, one per
    replicate: replicate ``r`` then quantises ``teacher[r]`` (``paths[r]`` must be its paths) and
    distils from it, so that the replicates vary the full-precision model too.

    The training is that of :func:`run_qat` (AdamW, warm-up and cosine decay, clipping), for all
    replicates in one stacked model. With ``track``, the signs of every path method are compared
    after each step with those before it (level skips, Eq. `eq-nearest`).
    """
    from icml26.rabit.stacked import stack_parameters, train_stacked
    if len(paths) != len(list(seeds)):
        raise ValueError("need one set of paths per seed")
    teachers = list(teacher) if isinstance(teacher, (list, tuple)) else [teacher] * len(paths)
    if len(teachers) != len(paths):
        raise ValueError(f"need one teacher per replicate ({len(paths)}), got {len(teachers)}")
    for model in teachers:
        for parameter in model.parameters():
            parameter.requires_grad_(False)
    students = [build_quantized(t, method, p, ste) for t, p in zip(teachers, paths, strict=True)]
    trainable, fixed = stack_parameters(students)
    if all(t is teachers[0] for t in teachers):  # one teacher shared by every replicate
        teacher_stack = (teachers[0], None)
    else:
        teacher_stack = (teachers[0], stack_parameters(teachers)[1])
    template = students[0]
    count = len(paths)
    layers = list(quantized_layers(template))
    track = track and method != "lsq"
    mode = "rabit" if method == "rabit" else "independent"
    n_paths = quantized_layers(template)[layers[0]].count if layers and method != "lsq" else 0
    skips, changes = torch.zeros(count, dtype=torch.float64), torch.zeros(count,
                                                                          dtype=torch.float64)
    unexplained = torch.zeros(count, dtype=torch.float64)
    gaps: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # RaBiT: (latent, G_1) per layer

    def levels_now() -> dict[str, torch.Tensor]:
        """Level index 2 [b_1 > 0] + [b_2 > 0] of every weight, ``(R, m, n)`` int8 per layer."""
        params = {**fixed, **trainable}
        with torch.no_grad():
            levels = {}
            for name in layers:
                first = params[f"{name}.latents.0"]
                if mode == "rabit":  # Eq. `eq-rabit`: path 2 binarizes w - G_1 b_1
                    scale = (params[f"{name}.out_scales.0"][:, :, None]
                             * params[f"{name}.in_scales.0"][:, None, :])
                    up = first >= 0
                    second = first - torch.where(up, scale, -scale) >= 0
                    gaps[name] = (first.clone(), scale)
                else:
                    up, second = first >= 0, params[f"{name}.latents.1"] >= 0
                levels[name] = up.to(torch.int8).mul_(2).add_(second.to(torch.int8))
            return levels

    start = levels_now() if track else {}
    previous, previous_gaps = dict(start), dict(gaps)

    def callback(step: int) -> None:
        nonlocal previous, previous_gaps
        current = levels_now()
        for name, after in current.items():
            moved = (after - previous[name]).abs_().flatten(1)
            skipped = moved > 1
            skips.add_(skipped.sum(1))
            changes.add_((moved > 0).sum(1))
            if mode == "rabit" and skipped.any():  # rare: test each skip against Eq. eq-nearest
                (w_old, g_old), (w_new, g_new) = previous_gaps[name], gaps[name]
                ruled_out = ((g_old > 0) & (g_new > 0)
                             & ((w_new - w_old).abs() <= torch.minimum(g_old, g_new)))
                unexplained.add_((skipped & ruled_out.flatten(1)).sum(1))
        previous, previous_gaps = current, dict(gaps)

    losses = train_stacked(template, trainable, fixed, train_tokens, steps=steps, lrs=lr,
                           seeds=seeds, batch_size=batch_size, teacher=teacher_stack,
                           callback=callback if track else None)
    if track:
        end = levels_now()
        total = sum(start[name][0].numel() for name in layers)
        bit = (lambda v: v >= 2, lambda v: v % 2 == 1)  # path 1's sign, path 2's sign
        flips = np.stack([sum((bit[p](end[name]) != bit[p](start[name])).flatten(1).sum(1)
                              for name in layers).numpy() / total for p in range(n_paths)], 1)
    else:
        flips = np.full((count, 0), np.nan)
    lr = float(lr) if np.ndim(lr) == 0 else tuple(float(v) for v in lr)
    return Replicates(method, lr, template, trainable, fixed, losses, skips.numpy(),
                      changes.numpy(), flips, unexplained.numpy())
