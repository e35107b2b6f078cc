"""Dense-to-MoE conversion of a tiny next-scale (VAR-style) autoregressive model (Prism-MoE).

The chapter ``prism-moe`` converts the GELU feed-forward network (FFN) of every block of a small
class-conditional next-scale image model into a mixture of experts (MoE) and compares ways of
doing it.

* **Data.** :func:`digit_pyramids` turns ``sklearn``'s 8x8 digits into token pyramids of
  1x1, 2x2, 4x4, 8x8 maps with a few intensity levels; :func:`var_inputs` builds the model's input
  (a class token, then each coarser map upsampled to the next size, eq-pm-var).
* **Model.** :class:`VARLite` is a :class:`icml26.nn.TinyGPT` whose causal mask is replaced by the
  block-causal mask of :func:`block_causal_mask`; it is trained by :func:`train_var`.
  :func:`generate` samples scale by scale.
* **MoE layer.** :class:`MoEMLP` splits the FFN's hidden neurons into a shared set and equal
  routed experts (eq-pm-moe), routes each token to its top-k experts with hard gates (value 1,
  straight-through gradient) and keeps a frozen copy of the dense FFN for the routing supervision.
* **Conversions.** :func:`convert` builds the five conversions of the chapter (random split with a
  centroid router, magnitude and Taylor pruning, Stage I without and with the least-squares
  compensation) from the statistics of :func:`layer_statistics` (Taylor importance eq-pm-taylor,
  trajectory profile eq-pm-profile), :func:`capacity_kmeans`, :func:`ridge_router`
  (eq-pm-router) and :func:`ridge_delta` (eq-pm-comp).
* **Fine-tuning and metrics.** :func:`finetune` (eq-pm-stage2), :func:`sequence_nll`,
  :func:`trajectory_kl` (eq-pm-trajkl), :func:`frechet_distance`, :func:`flops_per_token`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from icml26.core import check_count
from icml26.nn import GPTConfig, TinyGPT, cosine_schedule, record_inputs

SIDES = (1, 2, 4, 8)
"""Side lengths of the token maps, coarse to fine."""


def scale_offsets(sides=SIDES) -> list[int]:
    """Start of each scale's block in the flattened pyramid, plus the total length."""
    offsets = [0]
    for side in sides:
        offsets.append(offsets[-1] + side * side)
    return offsets


# --- Data --------------------------------------------------------------------------------------


def quantise(values: np.ndarray, levels: int) -> np.ndarray:
    """Map intensities in [0, 16] to ``levels`` equal bins ``0 .. levels - 1``."""
    levels = check_count(levels, "levels", 2)
    return np.clip(np.floor(np.asarray(values) * levels / 17.0), 0, levels - 1).astype(np.int64)


def dequantise(tokens, levels: int) -> np.ndarray:
    """Bin centres in [0, 16] of quantised tokens (the image a token map stands for)."""
    return (np.asarray(tokens, dtype=float) + 0.5) * 17.0 / levels


def digit_pyramids(levels: int = 4, sides=SIDES) -> tuple[np.ndarray, np.ndarray]:
    """Token pyramids ``(n, sum side^2)`` of ``load_digits`` and the class labels ``(n,)``.

    Each coarser map is the average pooling of the 8x8 image, quantised on its own.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = digits.images  # (n, 8, 8), values 0..16
    if sides[-1] != images.shape[1]:
        raise ValueError(f"the finest side must be {images.shape[1]}, got {sides[-1]}")
    maps = []
    for side in sides:
        f = images.shape[1] // side
        pooled = images.reshape(-1, side, f, side, f).mean(axis=(2, 4))
        maps.append(quantise(pooled, levels).reshape(len(images), -1))
    return np.concatenate(maps, axis=1), digits.target.astype(np.int64)


def upsample(tokens: torch.Tensor, side: int) -> torch.Tensor:
    """Nearest-neighbour upsampling of flattened ``(n, side^2)`` maps to ``(n, (2 side)^2)``."""
    grid = tokens.reshape(-1, side, side)
    return grid.repeat_interleave(2, dim=1).repeat_interleave(2, dim=2).reshape(len(tokens), -1)


def var_inputs(tokens, labels, levels: int, sides=SIDES) -> torch.Tensor:
    """Model inputs for target pyramids ``tokens`` (eq-pm-var).

    Position 0 holds the class token ``levels + label``; the block of scale ``k >= 1`` holds the
    tokens of scale ``k - 1`` upsampled to side ``sides[k]``.
    """
    tokens = torch.as_tensor(np.asarray(tokens)).long()
    labels = torch.as_tensor(np.asarray(labels)).long()
    offsets = scale_offsets(sides)
    if tokens.ndim != 2 or tokens.shape[1] != offsets[-1]:
        raise ValueError(f"tokens must have shape (n, {offsets[-1]}), got {tuple(tokens.shape)}")
    if labels.shape != (tokens.shape[0],):
        raise ValueError("one label per pyramid is required")
    inputs = torch.empty_like(tokens)
    inputs[:, 0] = levels + labels
    for k in range(1, len(sides)):
        coarse = tokens[:, offsets[k - 1]:offsets[k]]
        inputs[:, offsets[k]:offsets[k + 1]] = upsample(coarse, sides[k - 1])
    return inputs


def block_causal_mask(sides=SIDES) -> torch.Tensor:
    """Boolean ``(T, T)`` mask: a position sees every position of its own and coarser scales."""
    offsets = scale_offsets(sides)
    scale = torch.zeros(offsets[-1], dtype=torch.long)
    for k in range(len(sides)):
        scale[offsets[k]:offsets[k + 1]] = k
    return scale[:, None] >= scale[None, :]


# --- The dense model -----------------------------------------------------------------------------


class VARLite(nn.Module):
    """Next-scale model: a :class:`TinyGPT` with a block-causal mask and a class token.

    ``forward(inputs)`` returns logits over the ``levels`` intensity tokens only.
    """

    def __init__(self, levels: int = 4, n_classes: int = 10, d_model: int = 32,
                 n_layers: int = 2, n_heads: int = 4, d_mlp: int = 128, sides=SIDES,
                 seed: int = 0) -> None:
        super().__init__()
        self.levels, self.sides = check_count(levels, "levels", 2), tuple(sides)
        context = scale_offsets(self.sides)[-1]
        config = GPTConfig(vocab_size=levels + n_classes, context=context, d_model=d_model,
                           n_layers=n_layers, n_heads=n_heads, d_mlp=d_mlp)
        self.gpt = TinyGPT(config, seed=seed)
        mask = block_causal_mask(self.sides)
        for block in self.gpt.blocks:
            block.attn.mask = mask.clone()

    @property
    def blocks(self):
        return self.gpt.blocks

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.gpt(inputs)[..., :self.levels]


def train_var(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, *, steps: int,
              batch_size: int = 64, lr: float = 3e-3, loss=None, params=None, seed: int = 0,
              eval_every: int = 0, eval_fn=None, aux: torch.Tensor | None = None) -> dict:
    """AdamW with warm-up and cosine decay on random mini-batches of whole pyramids.

    ``loss(model, x, y)`` defaults to the mean cross-entropy; with ``aux`` (a tensor aligned with
    ``inputs``, such as a teacher's precomputed logits) it is ``loss(model, x, y, aux[rows])``.
    ``eval_fn(model)`` is called every ``eval_every`` steps (and at step 0 and at the end) for
    learning curves.
    """
    steps = check_count(steps, "steps", 1)
    loss = (lambda m, x, y: F.cross_entropy(m(x).flatten(0, 1), y.flatten())) \
        if loss is None else loss
    params = [p for p in (model.parameters() if params is None else params) if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 10)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: cosine_schedule(s, steps, warmup))
    generator = torch.Generator().manual_seed(int(seed))
    history = {"loss": [], "eval_step": [], "eval": []}

    def evaluate(step):
        if eval_fn is not None and eval_every:
            model.eval()
            history["eval_step"].append(step)
            history["eval"].append(float(eval_fn(model)))
            model.train()

    evaluate(0)
    model.train()
    for step in range(steps):
        rows = torch.randint(len(inputs), (batch_size,), generator=generator)
        batch = (inputs[rows], targets[rows]) + (() if aux is None else (aux[rows],))
        value = loss(model, *batch)
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        scheduler.step()
        history["loss"].append(value.item())
        if eval_every and ((step + 1) % eval_every == 0 and step + 1 < steps):
            evaluate(step + 1)
    evaluate(steps)
    model.eval()
    return history


@torch.no_grad()
def generate(model: VARLite, labels, generator: torch.Generator,
             temperature: float = 1.0) -> torch.Tensor:
    """Class-conditional pyramids, one scale at a time (all tokens of a scale in parallel)."""
    labels = torch.as_tensor(np.asarray(labels)).long()
    offsets, sides = scale_offsets(model.sides), model.sides
    n = len(labels)
    inputs = torch.zeros(n, offsets[-1], dtype=torch.long)
    tokens = torch.zeros_like(inputs)
    inputs[:, 0] = model.levels + labels
    model.eval()
    for k in range(len(sides)):
        start, end = offsets[k], offsets[k + 1]
        logits = model(inputs[:, :end])[:, start:end] / temperature
        probs = logits.softmax(-1).flatten(0, 1)
        tokens[:, start:end] = torch.multinomial(probs, 1, generator=generator).view(n, -1)
        if k + 1 < len(sides):
            inputs[:, end:offsets[k + 2]] = upsample(tokens[:, start:end], sides[k])
    return tokens


# --- Metrics ------------------------------------------------------------------------------------


@torch.no_grad()
def sequence_nll(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> np.ndarray:
    """Teacher-forced NLL (nats per token) of each pyramid: ``(n,)``."""
    model.eval()
    logits = model(inputs)
    nll = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    return nll.mean(1).numpy()


@torch.no_grad()
def trajectory_kl(dense: nn.Module, moe: nn.Module, inputs: torch.Tensor,
                  per_scale: bool = False) -> np.ndarray:
    """Mean per-token ``KL(p_dense || p_moe)`` along (dense-generated) inputs (eq-pm-trajkl).

    Returns ``(n,)``, or ``(n, scales)`` with ``per_scale``.
    """
    dense.eval()
    moe.eval()
    log_p = F.log_softmax(dense(inputs), -1)
    log_q = F.log_softmax(moe(inputs), -1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    if not per_scale:
        return kl.mean(1).numpy()
    offsets = scale_offsets(dense.sides)
    pairs = zip(offsets[:-1], offsets[1:], strict=True)
    return torch.stack([kl[:, a:b].mean(1) for a, b in pairs], 1).numpy()


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Fréchet distance between Gaussians fitted to the rows of ``a`` and ``b`` (closed form)."""
    from scipy import linalg

    a, b = np.asarray(a, float), np.asarray(b, float)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError("a and b must be 2-D with the same number of columns")
    mu_a, mu_b = a.mean(0), b.mean(0)
    cov_a, cov_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    root = linalg.sqrtm(cov_a @ cov_b)
    root = root.real if np.iscomplexobj(root) else root
    return float(np.sum((mu_a - mu_b) ** 2) + np.trace(cov_a + cov_b - 2 * root))


# --- The MoE layer -----------------------------------------------------------------------------


def check_structure(width: int, n_shared: int, n_experts: int, top_k: int) -> int:
    """Validate a shared + routed split of ``width`` neurons; return the expert size."""
    width = check_count(width, "width", 1)
    n_shared = check_count(n_shared, "n_shared", 0)
    n_experts = check_count(n_experts, "n_experts", 0)
    top_k = check_count(top_k, "top_k", 0)
    if n_shared > width:
        raise ValueError(f"n_shared ({n_shared}) exceeds the hidden width ({width})")
    if n_experts == 0:
        if top_k:
            raise ValueError(f"top_k ({top_k}) is larger than the number of experts (0)")
        return 0
    if (width - n_shared) % n_experts:
        raise ValueError(f"{n_experts} experts do not divide the {width - n_shared} routed "
                         f"neurons (hidden width {width}, {n_shared} shared)")
    if top_k > n_experts:
        raise ValueError(f"top_k ({top_k}) is larger than the number of experts ({n_experts})")
    if top_k < 1:
        raise ValueError("top_k must be at least 1 when there are experts")
    return (width - n_shared) // n_experts


def active_fraction(width: int, n_shared: int, n_experts: int, top_k: int) -> float:
    """Fraction of FFN hidden neurons (equivalently FFN weights) a token uses."""
    size = check_structure(width, n_shared, n_experts, top_k)
    return (n_shared + top_k * size) / width


def structure_for_fraction(width: int, fraction: float, shared_ratio: float = 0.25,
                           n_experts: int = 12) -> tuple[int, int, int]:
    """``(n_shared, n_experts, top_k)`` whose active fraction is exactly ``fraction``."""
    fraction = float(fraction)
    if not 0 < fraction <= 1:
        raise ValueError(f"the active fraction must lie in (0, 1], got {fraction}")
    n_shared = int(round(shared_ratio * width))
    size = check_structure(width, n_shared, n_experts, 1)
    top_k = (fraction * width - n_shared) / size
    if abs(top_k - round(top_k)) > 1e-9 or not 1 <= round(top_k) <= n_experts:
        raise ValueError(f"fraction {fraction} is not reachable with {n_shared} shared neurons "
                         f"and {n_experts} experts of {size}")
    return n_shared, n_experts, int(round(top_k))


class MoEMLP(nn.Module):
    """Shared neurons plus top-k routed experts cut from a dense FFN (eq-pm-moe).

    ``shared`` and ``groups`` are index arrays of the dense hidden neurons. Gates are hard (value 1
    for each selected expert) with a straight-through gradient through the router's softmax, so
    the converted layer starts exactly as the decomposition and the router can still learn. The
    dense FFN is kept as frozen buffers for the routing supervision (eq-pm-route).
    """

    def __init__(self, dense: nn.Module, shared, groups, top_k: int,
                 router_weight: torch.Tensor | None = None,
                 router_bias: torch.Tensor | None = None) -> None:
        super().__init__()
        w1, b1 = dense.fc_in.weight.detach(), dense.fc_in.bias.detach()
        w2, b2 = dense.fc_out.weight.detach(), dense.fc_out.bias.detach()
        width, d = w1.shape
        shared = torch.as_tensor(np.asarray(shared, dtype=np.int64))
        groups = torch.as_tensor(np.asarray(groups, dtype=np.int64)).reshape(len(groups), -1) \
            if len(groups) else torch.zeros(0, 0, dtype=torch.long)
        n_experts = groups.shape[0]
        used = torch.cat([shared, groups.flatten()])
        if len(used) != len(torch.unique(used)) or (len(used) and int(used.max()) >= width):
            raise ValueError("shared and expert neurons must be distinct indices below the width")
        if n_experts:
            check_structure(len(used), len(shared), n_experts, top_k)
        elif top_k:
            raise ValueError(f"top_k ({top_k}) is larger than the number of experts (0)")
        self.top_k, self.n_experts, self.width = int(top_k), n_experts, width
        self.shared_index, self.group_index = shared, groups
        self.w1_s = nn.Parameter(w1[shared].clone())
        self.b1_s = nn.Parameter(b1[shared].clone())
        self.w2_s = nn.Parameter(w2[:, shared].clone())
        self.b2 = nn.Parameter(b2.clone())
        self.w1_e = nn.Parameter(w1[groups].clone())  # (E, m, d)
        self.b1_e = nn.Parameter(b1[groups].clone())  # (E, m)
        self.w2_e = nn.Parameter(w2[:, groups].permute(1, 0, 2).clone())  # (E, d, m)
        rw = torch.zeros(n_experts, d) if router_weight is None else router_weight
        rb = torch.zeros(n_experts) if router_bias is None else router_bias
        self.router_w = nn.Parameter(torch.as_tensor(rw, dtype=w1.dtype).clone())
        self.router_b = nn.Parameter(torch.as_tensor(rb, dtype=w1.dtype).clone())
        for name, value in (("dense_w1", w1), ("dense_b1", b1), ("dense_w2", w2),
                            ("dense_b2", b2)):
            self.register_buffer(name, value.clone(), persistent=False)
        self.last: dict = {}
        self.record = False

    def router_logits(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.router_w.T + self.router_b

    def select(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Hard top-k gates ``(..., E)`` (straight-through) and the router logits."""
        logits = self.router_logits(x)
        top = logits.topk(self.top_k, dim=-1).indices
        hard = torch.zeros_like(logits).scatter(-1, top, 1.0)
        probs = logits.softmax(-1)
        return hard + probs * hard - (probs * hard).detach(), logits

    def expert_outputs(self, x: torch.Tensor) -> torch.Tensor:
        """Every expert's output ``(..., E, d)`` (without ``b2``)."""
        h = F.gelu(torch.einsum("...d,emd->...em", x, self.w1_e) + self.b1_e)
        return torch.einsum("...em,edm->...ed", h, self.w2_e)

    def shared_output(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x @ self.w1_s.T + self.b1_s) @ self.w2_s.T

    def dense_output(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x @ self.dense_w1.T + self.dense_b1) @ self.dense_w2.T + self.dense_b2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.shared_output(x) + self.b2
        if not self.n_experts:
            return y
        gates, logits = self.select(x)
        n_exp, m, d = self.w1_e.shape
        # every expert's hidden units in one matmul, then sum_e g_e W2_e h_e as one matmul over
        # the gate-scaled units (the same as summing gated expert_outputs, with fewer copies)
        h = F.gelu(x @ self.w1_e.reshape(n_exp * m, d).T + self.b1_e.reshape(-1))
        gated = (h.unflatten(-1, (n_exp, m)) * gates.unsqueeze(-1)).flatten(-2)
        y = y + gated @ self.w2_e.permute(1, 0, 2).reshape(d, n_exp * m).T
        if self.record:
            with torch.no_grad():
                experts = torch.einsum("...em,edm->...ed", h.unflatten(-1, (n_exp, m)),
                                       self.w2_e)
            self.last = {"x": x, "logits": logits, "experts": experts}
        return y

    @torch.no_grad()
    def sparse_forward(self, x: torch.Tensor) -> torch.Tensor:
        """Inference path that computes each expert only on its own tokens."""
        flat = x.reshape(-1, x.shape[-1])
        y = self.shared_output(flat) + self.b2
        if self.n_experts:
            top = self.router_logits(flat).topk(self.top_k, dim=-1).indices
            for e in range(self.n_experts):
                rows = (top == e).any(-1).nonzero().squeeze(-1)
                if len(rows):
                    h = F.gelu(flat[rows] @ self.w1_e[e].T + self.b1_e[e])
                    y.index_add_(0, rows, h @ self.w2_e[e].T)
        return y.reshape(x.shape)

    def active_neurons(self) -> int:
        return len(self.shared_index) + self.top_k * (self.group_index.shape[1]
                                                      if self.n_experts else 0)


def moe_layers(model: VARLite) -> list[MoEMLP]:
    """The :class:`MoEMLP` layers of a converted model."""
    return [block.mlp for block in model.blocks if isinstance(block.mlp, MoEMLP)]


def sparse_inference(model: VARLite, inputs: torch.Tensor) -> torch.Tensor:
    """Forward pass that uses :meth:`MoEMLP.sparse_forward` in every MoE layer (timing)."""
    originals = []
    for layer in moe_layers(model):
        originals.append(layer.forward)
        layer.forward = layer.sparse_forward
    try:
        with torch.no_grad():
            return model(inputs)
    finally:
        for layer, original in zip(moe_layers(model), originals, strict=True):
            layer.forward = original


# --- Calibration statistics ----------------------------------------------------------------------


def ffn_inputs(model: VARLite, inputs: torch.Tensor) -> list[torch.Tensor]:
    """Input of each block's FFN (after ``ln2``): list of ``(n, T, d)``."""
    names = [f"gpt.blocks.{i}.mlp" for i in range(len(model.blocks))]
    recorded = record_inputs(model, inputs, names)
    return [recorded[name].reshape(*inputs.shape[:2], -1) for name in names]


def taylor_importance(model: VARLite, inputs: torch.Tensor, targets: torch.Tensor,
                      batch_size: int = 64) -> list[np.ndarray]:
    """First-order Taylor importance of each hidden neuron of each FFN (eq-pm-taylor)."""
    model.zero_grad(set_to_none=True)
    scores = [np.zeros(block.mlp.fc_in.out_features) for block in model.blocks]
    frozen = [p for p in model.parameters() if not p.requires_grad]
    for p in frozen:
        p.requires_grad_(True)
    for start in range(0, len(inputs), batch_size):
        x, y = inputs[start:start + batch_size], targets[start:start + batch_size]
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        for i, block in enumerate(model.blocks):
            fc_in, fc_out = block.mlp.fc_in, block.mlp.fc_out
            s = (fc_in.weight.grad * fc_in.weight).abs().sum(1) \
                + (fc_out.weight.grad * fc_out.weight).abs().sum(0) \
                + (fc_in.bias.grad * fc_in.bias).abs()
            scores[i] += s.detach().numpy()
    model.zero_grad(set_to_none=True)
    for p in frozen:
        p.requires_grad_(False)
    return scores


def magnitude_importance(model: VARLite) -> list[np.ndarray]:
    """``||W1[j]|| * ||W2[:, j]||`` for each hidden neuron of each FFN."""
    return [(b.mlp.fc_in.weight.norm(dim=1) * b.mlp.fc_out.weight.norm(dim=0)).detach().numpy()
            for b in model.blocks]


def stage_profile(mlp: nn.Module, x: torch.Tensor, sides=SIDES) -> np.ndarray:
    """Per-scale contribution energy ``P[j, s]`` of each hidden neuron (eq-pm-profile).

    ``x`` is the FFN input ``(n, T, d)`` along dense generations.
    """
    with torch.no_grad():
        act = F.gelu(x @ mlp.fc_in.weight.T + mlp.fc_in.bias)  # (n, T, H)
        out_norm = mlp.fc_out.weight.norm(dim=0) ** 2  # (H,)
        offsets = scale_offsets(sides)
        cols = [(act[:, a:b] ** 2).mean((0, 1)) * out_norm
                for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    return torch.log1p(torch.stack(cols, 1)).numpy()


def capacity_kmeans(features: np.ndarray, weights: np.ndarray, n_groups: int,
                    iterations: int = 8) -> np.ndarray:
    """Spherical k-means with exactly equal cluster sizes: labels ``(n,)``.

    Farthest-point initialisation weighted by importance, then greedy capacity-limited
    assignment in decreasing importance and importance-weighted centroid updates.
    """
    features = np.asarray(features, float)
    weights = np.asarray(weights, float)
    n = len(features)
    n_groups = check_count(n_groups, "n_groups", 1)
    if n % n_groups:
        raise ValueError(f"{n_groups} groups do not divide {n} neurons")
    capacity = n // n_groups
    unit = features / np.maximum(np.linalg.norm(features, axis=1, keepdims=True), 1e-12)
    w = np.sqrt(weights / max(weights.mean(), 1e-12))
    centres = [unit[int(np.argmax(w))]]
    while len(centres) < n_groups:
        closeness = np.max(unit @ np.array(centres).T, axis=1)
        centres.append(unit[int(np.argmax((1 - closeness) * w))])
    centres = np.array(centres)
    order = np.argsort(-weights, kind="stable")
    labels = np.zeros(n, dtype=np.int64)
    for _ in range(iterations):
        sims = unit @ centres.T
        counts = np.zeros(n_groups, dtype=np.int64)
        for j in order:
            for g in np.argsort(-sims[j], kind="stable"):
                if counts[g] < capacity:
                    labels[j], counts[g] = g, counts[g] + 1
                    break
        for g in range(n_groups):
            members = labels == g
            c = (w[members, None] * unit[members]).sum(0)
            centres[g] = c / max(np.linalg.norm(c), 1e-12)
    return labels


def stage_token_weights(sides=SIDES) -> np.ndarray:
    """Per-position weight ``1 / side^2`` of a position's scale: every scale weighs the same.

    The release code's ``stage_weight="uniform"`` scales each generation stage's Gram matrix by
    ``1 / pn^2``, ``pn`` the side of the stage's token map.
    """
    offsets = scale_offsets(sides)
    return np.concatenate([np.full(offsets[k + 1] - offsets[k], 1.0 / side ** 2)
                           for k, side in enumerate(sides)])


def ridge_router(x: np.ndarray, targets: np.ndarray, lam: float = 1e-2,
                 weights: np.ndarray | None = None) -> np.ndarray:
    """Router rows ``W`` (E, d), as in the release code (eq-pm-router).

    Minimises ``sum_t w_t ||W x_t - T_t||^2 + lam * mean diag(G) * ||W||^2`` with the weighted
    Gram matrix ``G = sum_t w_t x_t x_t^T``, no intercept and the targets centred per token, then
    rescales each expert's row to unit length (float64 normal equations).
    """
    x = np.asarray(x, float)
    t = np.asarray(targets, float)
    if x.ndim != 2 or t.ndim != 2 or len(x) != len(t):
        raise ValueError("x and targets must be 2-D with one row per token")
    w = np.ones(len(x)) if weights is None else np.asarray(weights, float)
    if w.shape != (len(x),) or np.any(w < 0):
        raise ValueError("weights must be one non-negative number per token")
    t = t - t.mean(1, keepdims=True)
    gram = (x * w[:, None]).T @ x
    reg = lam * max(float(np.mean(np.diag(gram))), 1e-8)
    sol = np.linalg.solve(gram + reg * np.eye(len(gram)), (x * w[:, None]).T @ t)
    rows = sol.T
    return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)


def balance_bias(logits: np.ndarray, top_k: int, strength: float = 0.25,
                 max_abs: float = 2.0) -> np.ndarray:
    """One balance update of the router bias from top-k counts, as in the release code.

    ``delta = strength * (log(1/E + eps) - log(freq + eps))`` with ``eps = 1 / total``, centred,
    clipped to ``[-max_abs, max_abs]`` and centred again.
    """
    logits = np.asarray(logits, float)
    n_exp = logits.shape[1]
    top = np.argsort(-logits, axis=1, kind="stable")[:, :top_k]
    counts = np.bincount(top.ravel(), minlength=n_exp).astype(float)
    total = counts.sum()
    eps = 1.0 / max(total, 1.0)
    delta = strength * (np.log(1.0 / n_exp + eps) - np.log(counts / total + eps))
    bias = delta - delta.mean()
    if max_abs > 0:
        bias = np.clip(bias, -max_abs, max_abs)
        bias = bias - bias.mean()
    return bias


def expert_usage(layer: MoEMLP, x: torch.Tensor) -> float:
    """Share of a layer's experts selected by at least one of the tokens ``x``."""
    if not layer.n_experts:
        return 1.0
    with torch.no_grad():
        top = layer.router_logits(x.reshape(-1, x.shape[-1])).topk(layer.top_k, -1).indices
    return float(len(torch.unique(top)) / layer.n_experts)


def ridge_delta(h: np.ndarray, residual: np.ndarray, w_old: np.ndarray, lam_rel: float,
                cap: float) -> tuple[np.ndarray, float, float]:
    """Clipped ridge update of a down-projection (eq-pm-comp).

    Minimises ``||h (W_old + D)^T - R||^2 + lam ||D||^2`` with ``lam = lam_rel * mean diag(h^T h)``
    and rescales ``D`` so that ``||D||_F <= cap * ||W_old||_F``. Returns ``W_old + D`` and the
    reconstruction errors ``||h W^T - R||^2`` before and after.
    """
    h, r, w = (np.asarray(a, float) for a in (h, residual, w_old))
    if h.shape[0] != r.shape[0] or w.shape != (r.shape[1], h.shape[1]):
        raise ValueError("shapes must be h (N, m), residual (N, d), w_old (d, m)")
    if lam_rel < 0 or cap < 0:
        raise ValueError("lam_rel and cap must be non-negative")
    gram = h.T @ h
    lam = lam_rel * float(np.mean(np.diag(gram))) + 1e-12
    delta_t = np.linalg.solve(gram + lam * np.eye(len(gram)), h.T @ r - gram @ w.T)
    delta = delta_t.T
    norm, bound = np.linalg.norm(delta), cap * np.linalg.norm(w)
    if norm > bound:
        delta = delta * (bound / norm)
    before = float(np.sum((h @ w.T - r) ** 2))
    after = float(np.sum((h @ (w + delta).T - r) ** 2))
    return w + delta, before, after


@dataclass
class LayerStats:
    """Calibration statistics of one FFN."""

    taylor: np.ndarray
    magnitude: np.ndarray
    profile: np.ndarray  # (H, scales)
    x_traj: torch.Tensor  # FFN inputs along dense generations, (N, d)
    x_traj_seq: torch.Tensor  # the same, (n, T, d)


def layer_statistics(dense: VARLite, calib_inputs: torch.Tensor, calib_targets: torch.Tensor,
                     traj_inputs: torch.Tensor) -> list[LayerStats]:
    """Taylor importance on teacher-forced real pyramids, profiles on dense generations."""
    taylor = taylor_importance(dense, calib_inputs, calib_targets)
    magnitude = magnitude_importance(dense)
    xs = ffn_inputs(dense, traj_inputs)
    return [LayerStats(taylor[i], magnitude[i], stage_profile(block.mlp, xs[i], dense.sides),
                       xs[i].reshape(-1, xs[i].shape[-1]), xs[i])
            for i, block in enumerate(dense.blocks)]


METHODS = ("random", "magnitude", "taylor", "prism_nocomp", "prism")
"""The conversions of the chapter."""


def _expert_energy(mlp: nn.Module, x: torch.Tensor, groups: np.ndarray) -> np.ndarray:
    """Router targets: log(1 + sum over the expert's neurons of |act| * ||W2 col||)."""
    with torch.no_grad():
        act = F.gelu(x @ mlp.fc_in.weight.T + mlp.fc_in.bias).abs()
        contrib = act * mlp.fc_out.weight.norm(dim=0)
        energy = torch.stack([contrib[:, g].sum(1) for g in torch.as_tensor(groups)], 1)
    return torch.log1p(energy).numpy()


def _trajectory_router(mlp: nn.Module, st: LayerStats, groups: np.ndarray, top_k: int,
                       balance: float, sides) -> tuple[np.ndarray, np.ndarray]:
    """Stage I's router: ridge fit of the experts' trajectory energies, then the balance bias."""
    x = st.x_traj
    token_w = np.tile(stage_token_weights(sides), st.x_traj_seq.shape[0])
    rw = ridge_router(x.numpy(), _expert_energy(mlp, x, groups), weights=token_w)
    rb = balance_bias(x.numpy() @ rw.T, top_k, balance) if balance > 0 else np.zeros(len(groups))
    return rw, rb


def convert(dense: VARLite, stats: list[LayerStats], method: str, fraction: float, *,
            shared_ratio: float = 0.25, n_experts: int = 12, seed: int = 0,
            balance: float = 0.25, min_tokens: int = 64, router: str = "centroid",
            blind: bool = False) -> tuple[VARLite, dict]:
    """A converted copy of ``dense`` and a report (per-layer compensation errors).

    ``random``: random shared set and equal random experts, with a centroid router (MoEfication)
    or, with ``router="ridge"``, Stage I's router. ``magnitude`` / ``taylor``: keep the top
    ``fraction`` neurons by that score as a pruned dense FFN. ``prism_nocomp``: Stage I steps
    (importance pool, trajectory-profile shared choice, capacity k-means experts, ridge router,
    balance bias). ``prism``: plus the compensation (eq-pm-comp). ``blind=True`` (Stage I only)
    hands every neuron the statistics of another one (Taylor score, trajectory profile and input
    weights, permuted by ``seed``), so the grouping sees nothing of the neurons it groups while
    the router is still fitted to the real experts: the falsification control of the grouping.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {METHODS}")
    if router not in ("centroid", "ridge"):
        raise ValueError(f"router must be 'centroid' or 'ridge', got {router!r}")
    if router == "ridge" and method != "random":
        raise ValueError("router='ridge' applies to the random split only (Stage I always uses it)")
    if blind and method not in ("prism_nocomp", "prism"):
        raise ValueError(f"blind=True applies to Stage I only, not to {method!r}")
    fraction = float(fraction)
    if not 0 < fraction <= 1:
        raise ValueError(f"the active fraction must lie in (0, 1], got {fraction}")
    model = copy.deepcopy(dense)
    rng = np.random.default_rng(seed)
    report = {"errors": []}
    for i, block in enumerate(model.blocks):
        mlp, st = block.mlp, stats[i]
        width = mlp.fc_in.out_features
        if method in ("magnitude", "taylor"):
            score = st.magnitude if method == "magnitude" else st.taylor
            keep = int(round(fraction * width))
            shared = np.sort(np.argsort(-score, kind="stable")[:keep])
            block.mlp = MoEMLP(mlp, shared, [], 0)
            continue
        n_shared, n_exp, top_k = structure_for_fraction(width, fraction, shared_ratio, n_experts)
        if method == "random":
            perm = rng.permutation(width)
            shared, groups = np.sort(perm[:n_shared]), perm[n_shared:].reshape(n_exp, -1)
            if router == "ridge":
                rw, rb = _trajectory_router(mlp, st, groups, top_k, balance, dense.sides)
            else:
                w1 = mlp.fc_in.weight.detach().numpy()
                rw = np.stack([w1[g].mean(0) for g in groups])
                rb = np.array([mlp.fc_in.bias.detach().numpy()[g].mean() for g in groups])
            block.mlp = MoEMLP(mlp, shared, groups, top_k, torch.tensor(rw), torch.tensor(rb))
            continue
        # the statistics Stage I groups by: neuron j is described by row view[j]
        w1 = mlp.fc_in.weight.detach().numpy()
        view = rng.permutation(width) if blind else np.arange(width)
        taylor, profile, w1 = st.taylor[view], st.profile[view], w1[view]
        # Stage I: shared set from the importance pool, by trajectory contribution.
        pool = np.argsort(-taylor, kind="stable")[:min(width, 2 * n_shared)]
        shared_score = profile.sum(1)
        shared = np.sort(pool[np.argsort(-shared_score[pool], kind="stable")[:n_shared]])
        rest = np.setdiff1d(np.arange(width), shared)
        w1n = w1[rest] / np.linalg.norm(w1[rest], axis=1, keepdims=True)
        prof = profile[rest]
        prof = prof / np.maximum(np.linalg.norm(prof, axis=1, keepdims=True), 1e-12)
        labels = capacity_kmeans(np.hstack([0.5 * w1n, prof]), taylor[rest], n_exp)
        groups = np.stack([rest[labels == g] for g in range(n_exp)])
        rw, rb = _trajectory_router(mlp, st, groups, top_k, balance, dense.sides)
        layer = MoEMLP(mlp, shared, groups, top_k, torch.tensor(rw), torch.tensor(rb))
        if method == "prism":
            report["errors"].extend(_compensate(layer, mlp, st.x_traj, min_tokens, i))
        block.mlp = layer
    report["structure"] = [(len(b.mlp.shared_index), b.mlp.n_experts, b.mlp.top_k)
                           for b in model.blocks]
    return model, report


def _compensate(layer: MoEMLP, mlp: nn.Module, x: torch.Tensor, min_tokens: int,
                index: int) -> list[dict]:
    """Ridge-plus-clip updates of the shared and then each routed ``W2`` (eq-pm-comp)."""
    errors = []
    with torch.no_grad():
        target = (mlp(x) - layer.b2).numpy()
        gates, _ = layer.select(x)
        gates = gates.detach().numpy()
        experts = layer.expert_outputs(x).numpy()  # (N, E, d)
        routed = (gates[..., None] * experts).sum(1)
        h_s = F.gelu(x @ layer.w1_s.T + layer.b1_s).numpy()
        w_new, before, after = ridge_delta(h_s, target - routed, layer.w2_s.numpy(), 10.0, 0.05)
        layer.w2_s.copy_(torch.tensor(w_new, dtype=layer.w2_s.dtype))
        errors.append({"layer": index, "part": "shared", "before": before, "after": after})
        residual = target - h_s @ w_new.T - routed
        for e in range(layer.n_experts):
            rows = gates[:, e] > 0.5
            if rows.sum() < min_tokens:
                continue
            h_e = F.gelu(x[rows] @ layer.w1_e[e].T + layer.b1_e[e]).numpy()
            w_old = layer.w2_e[e].numpy()
            r_e = residual[rows] + h_e @ w_old.T
            w_e, before, after = ridge_delta(h_e, r_e, w_old, 20.0, 0.02)
            layer.w2_e[e].copy_(torch.tensor(w_e, dtype=layer.w2_e.dtype))
            residual[rows] = r_e - h_e @ w_e.T
            errors.append({"layer": index, "part": f"expert {e}", "before": before,
                           "after": after})
    return errors


def calibration_error(model: VARLite, dense: VARLite, stats: list[LayerStats]) -> np.ndarray:
    """Per-layer ``||FFN_moe(x) - FFN_dense(x)||^2`` on the calibration inputs (dense inputs)."""
    out = []
    with torch.no_grad():
        for block, dblock, st in zip(model.blocks, dense.blocks, stats, strict=True):
            out.append(float(((block.mlp(st.x_traj) - dblock.mlp(st.x_traj)) ** 2).sum()))
    return np.array(out)


# --- Stage II ----------------------------------------------------------------------------------


def routing_targets(layer: MoEMLP, x: torch.Tensor, experts: torch.Tensor,
                    temperature: float = 1.0) -> torch.Tensor:
    """Target routing distribution from each expert's reduction of the dense gap (eq-pm-route).

    ``score_e = ||g||^2 - ||g - y_e||^2 = 2 <y_e, g> - ||y_e||^2`` with ``g`` the dense output
    minus the shared part; scores are standardised across experts, then a softmax.
    """
    with torch.no_grad():
        g = layer.dense_output(x) - layer.shared_output(x) - layer.b2
        score = 2 * (experts * g.unsqueeze(-2)).sum(-1) - (experts ** 2).sum(-1)
        score = (score - score.mean(-1, keepdim=True)) / (score.std(-1, keepdim=True) + 1e-6)
        return (score / temperature).softmax(-1)


def _stage2_value(forward, layers: list, teacher_forward, x: torch.Tensor, y: torch.Tensor,
                  route_weight: float, kd_weight: float, confidence: bool,
                  lb_weight: float) -> torch.Tensor:
    """The fine-tuning loss of one model, given its forward and its MoE layers."""
    with torch.no_grad():
        t_logp = F.log_softmax(teacher_forward(x), -1)
        entropy = -(t_logp.exp() * t_logp).sum(-1)  # (B, T)
        weight = entropy / entropy.mean() if confidence else torch.ones_like(entropy)
    record = route_weight > 0 or lb_weight > 0
    for layer in layers:
        layer.record = record
    logits = forward(x)
    total = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    logp = F.log_softmax(logits, -1)
    total = total + kd_weight * (t_logp.exp() * (t_logp - logp)).sum(-1).mean()
    if record:
        for layer in layers:
            if not layer.n_experts:
                continue
            rec = layer.last
            if route_weight > 0:
                q = routing_targets(layer, rec["x"], rec["experts"].detach())
                ce = -(q * F.log_softmax(rec["logits"], -1)).sum(-1)
                total = total + route_weight * (weight * ce).mean() / len(layers)
            if lb_weight > 0:
                total = total + lb_weight * load_balance_loss(rec["logits"], layer.top_k) \
                    / len(layers)
            layer.record, layer.last = False, {}
    return total


def load_balance_loss(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Switch-style auxiliary loss ``E * sum_e f_e P_e`` (1 when the routing is uniform).

    ``f_e`` is the share of top-k slots that go to expert ``e`` (no gradient) and ``P_e`` its
    mean router probability.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    n_exp = flat.shape[-1]
    top = flat.topk(top_k, -1).indices
    share = torch.zeros_like(flat).scatter(-1, top, 1.0).mean(0) / top_k
    return n_exp * (share.detach() * flat.softmax(-1).mean(0)).sum()


def stage2_loss(teacher: VARLite, route_weight: float = 0.1, kd_weight: float = 1.0,
                confidence: bool = True, lb_weight: float = 0.0):
    """CE + KD(dense teacher) + confidence-weighted routing supervision (eq-pm-stage2).

    ``lb_weight > 0`` adds the load-balancing loss of :func:`load_balance_loss` (the baseline
    that replaces the routing supervision by a balance term).
    """

    def loss(model: VARLite, x: torch.Tensor, y: torch.Tensor,
             teacher_logits: torch.Tensor | None = None) -> torch.Tensor:
        forward = teacher if teacher_logits is None else (lambda _: teacher_logits)
        return _stage2_value(model, moe_layers(model), forward, x, y, route_weight, kd_weight,
                             confidence, lb_weight)

    return loss


@torch.no_grad()
def teacher_logits(teacher: VARLite, inputs: torch.Tensor, chunk: int = 512) -> torch.Tensor:
    """The frozen teacher's logits on every row of ``inputs``, computed once for fine-tuning."""
    teacher.eval()
    return torch.cat([teacher(inputs[i:i + chunk]) for i in range(0, len(inputs), chunk)])


def finetune(model: VARLite, teacher: VARLite, inputs, targets, *, steps: int,
             route_weight: float = 0.1, lr: float = 1e-3, batch_size: int = 64, seed: int = 0,
             eval_every: int = 0, eval_fn=None, lb_weight: float = 0.0,
             cached: torch.Tensor | None = None) -> dict:
    """Stage II fine-tuning of every parameter of ``model`` (eq-pm-stage2).

    The teacher is frozen: ``cached``, its logits on every row of ``inputs``
    (:func:`teacher_logits`), saves its forward pass at every step and can be shared between runs
    on the same teacher and data; without it the teacher runs on each batch.
    """
    return train_var(model, inputs, targets, steps=steps, batch_size=batch_size, lr=lr,
                     loss=stage2_loss(teacher, route_weight, lb_weight=lb_weight), seed=seed,
                     eval_every=eval_every, eval_fn=eval_fn, aux=cached)


# --- Costs -------------------------------------------------------------------------------------


def flops_per_token(model: VARLite) -> dict:
    """Multiply-accumulates x 2 per token (FFN, attention, router, head), averaged over positions.

    Attention scores cost ``2 d`` per attended position; with the block-causal mask a position of
    scale ``k`` attends to every position of scales ``<= k``.
    """
    offsets = scale_offsets(model.sides)
    seen = np.concatenate([[offsets[k + 1]] * (offsets[k + 1] - offsets[k])
                           for k in range(len(model.sides))])
    d = model.gpt.config.d_model
    attn = ffn = router = 0.0
    for block in model.blocks:
        attn += 2 * (4 * d * d + 2 * d * seen.mean())
        mlp = block.mlp
        if isinstance(mlp, MoEMLP):
            ffn += 2 * 2 * d * mlp.active_neurons()
            router += 2 * d * mlp.n_experts
        else:
            ffn += 2 * 2 * d * mlp.fc_in.out_features
    head = 2 * d * model.gpt.config.vocab_size
    return {"attention": attn, "ffn": ffn, "router": router, "head": head,
            "total": attn + ffn + router + head}


def active_parameters(model: VARLite) -> dict:
    """Parameters a token uses: FFN (active neurons) and the whole model."""
    d = model.gpt.config.d_model
    ffn_active = ffn_total = 0
    for block in model.blocks:
        mlp = block.mlp
        if isinstance(mlp, MoEMLP):
            ffn_active += mlp.active_neurons() * (2 * d + 1) + d + mlp.n_experts * (d + 1)
            ffn_total += (len(mlp.shared_index) + mlp.group_index.numel()) * (2 * d + 1) + d \
                + mlp.n_experts * (d + 1)
        else:
            count = sum(p.numel() for p in mlp.parameters())
            ffn_active, ffn_total = ffn_active + count, ffn_total + count
    other = sum(p.numel() for n, p in model.named_parameters() if ".mlp." not in n)
    return {"ffn_active": ffn_active, "ffn_total": ffn_total, "other": other,
            "active_total": ffn_active + other}


def time_forward(model: VARLite, inputs: torch.Tensor, repeats: int = 5) -> float:
    """Median seconds of one (sparse, for MoE layers) forward pass over ``inputs``."""
    import time

    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sparse_inference(model, inputs)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


# --- Trained dense teachers ------------------------------------------------------------------

TEACHER_FILE = Path(__file__).resolve().parents[2] / "data" / "prism_moe_teachers.pt"
"""State dicts of the chapter's dense models, written by ``data/make_prism_moe_teachers.py``
(which calls :func:`main`) and listed with its checksum in ``data/README.md``."""

TEACHER_RECIPE = dict(levels=4, d_model=32, d_mlp=128, steps=600, lr=6e-3, batch_size=32,
                      split_seed=0, test_size=0.2)
"""The recipe of the committed dense models: a fixed train/test split, AdamW, cosine decay."""


def teacher_split(n: int | None = None, labels=None, split_seed: int = 0,
                  test_size: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
    """The fixed stratified train / held-out split of the digits that the teachers were fit on."""
    from sklearn.model_selection import train_test_split

    if labels is None:
        _, labels = digit_pyramids()
    return train_test_split(np.arange(len(labels)), test_size=test_size, stratify=labels,
                            random_state=split_seed)


def train_teachers(seeds, *, levels: int = 4, d_model: int = 32, d_mlp: int = 128,
                   steps: int = 600, lr: float = 6e-3, batch_size: int = 32, split_seed: int = 0,
                   test_size: float = 0.2) -> list[VARLite]:
    """Dense models, one per seed, trained on the fixed training split (:func:`teacher_split`)."""
    tokens, labels = digit_pyramids(levels)
    train_idx, _ = teacher_split(labels=labels, split_seed=split_seed, test_size=test_size)
    inputs = var_inputs(tokens, labels, levels)
    targets = torch.as_tensor(tokens)
    models = []
    for seed in seeds:
        model = VARLite(levels, d_model=d_model, d_mlp=d_mlp, seed=int(seed))
        train_var(model, inputs[train_idx], targets[train_idx], steps=steps,
                  batch_size=batch_size, lr=lr, seed=int(seed))
        models.append(model)
    return models


def save_teachers(models: list[VARLite], seeds, path, recipe: dict) -> None:
    torch.save({"seeds": [int(s) for s in seeds], "recipe": dict(recipe),
                "state_dicts": [m.state_dict() for m in models]}, path)


def load_teachers(path=None) -> tuple[list[VARLite], list[int], dict]:
    """The committed dense models (frozen), their seeds and their recipe."""
    path = TEACHER_FILE if path is None else Path(path)
    blob = torch.load(path, weights_only=True)
    recipe = blob["recipe"]
    models = []
    for seed, state in zip(blob["seeds"], blob["state_dicts"], strict=True):
        model = VARLite(recipe["levels"], d_model=recipe["d_model"], d_mlp=recipe["d_mlp"],
                        seed=seed)
        model.load_state_dict(state)
        models.append(freeze(model))
    return models, list(blob["seeds"]), recipe


def freeze(model: VARLite) -> VARLite:
    """``model`` in evaluation mode with gradients off (how the chapter uses a dense model)."""
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()


def load_or_train_teachers(n: int, path=None) -> tuple[list[VARLite], list[int], dict]:
    """At least ``n`` frozen dense models: the stored ones, then more trained from new seeds.

    Models beyond the file's are trained with the file's recipe from seeds that continue its
    spacing of 1000 (about half a minute of CPU each), so the ``full`` tier can replicate over
    more dense models than the repository stores.
    """
    n = check_count(n, "n", 1)
    models, seeds, recipe = load_teachers(path)
    extra = [max(seeds) + 1000 * (i + 1) for i in range(max(0, n - len(models)))]
    if extra:
        models += [freeze(m) for m in train_teachers(extra, **recipe)]
    return models, seeds + extra, recipe


def main(argv=None) -> None:
    """``python -m icml26.prism_moe [--seeds ...] [--out PATH]``: train and save the teachers."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(0, 6000, 1000)))
    parser.add_argument("--steps", type=int, default=TEACHER_RECIPE["steps"])
    parser.add_argument("--out", default=str(TEACHER_FILE))
    args = parser.parse_args(argv)
    recipe = {**TEACHER_RECIPE, "steps": args.steps}
    torch.set_num_threads(1)
    kwargs = {k: v for k, v in recipe.items()}
    models = train_teachers(args.seeds, **kwargs)
    save_teachers(models, args.seeds, args.out, recipe)
    print(f"wrote {len(models)} teachers to {args.out}")


if __name__ == "__main__":
    main()
