"""A tiny GPT-style transformer, its training loop, hooks, checkpoints and Linear swapping.

The model is a standard pre-LayerNorm decoder: token and learned position embeddings, ``n_layers``
blocks of multi-head causal self-attention and a GELU MLP, a final LayerNorm and an untied output
head. It is small enough to train on two CPU cores in seconds, and it is shared by the chapters
that need a language model (RaBiT, anisotropy, dual steering, introspection, CoCoQuant,
Prism-MoE).

* **Hooks.** Every interesting activation passes through a named :class:`HookPoint` (an identity
  module), e.g. ``blocks.0.hook_resid_post`` or ``blocks.1.attn.hook_pattern``.
  :func:`run_with_cache` records them, :func:`hooks` replaces them (steering, ablation),
  :func:`hidden_states` stacks the residual stream of every layer, and :func:`record_inputs`
  collects the inputs of named Linear layers (calibration data for quantisation).
* **Training.** :func:`train` runs AdamW with warm-up and cosine decay on random windows of token
  sequences, with any loss (:func:`next_token_loss`, :func:`distillation_loss`), optional
  parameter subsets, callbacks and periodic checkpoints; :func:`evaluate_nll` measures the test
  loss.
* **Checkpoints.** :func:`save_checkpoint` / :func:`load_checkpoint` store the config and weights.
* **Swapping layers.** :func:`linear_layers` lists the block Linear layers by name and
  :func:`replace_linears` swaps them for any module with the same input and output (a quantised
  layer, a low-rank adapter, ...), in place.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from icml26.core import check_count


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of a :class:`TinyGPT`; ``d_mlp`` defaults to ``4 * d_model``."""

    vocab_size: int = 64
    context: int = 32
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_mlp: int | None = None
    causal: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context", "d_model", "n_layers", "n_heads"):
            check_count(getattr(self, name, 1), name)
        if self.d_mlp is None:
            object.__setattr__(self, "d_mlp", 4 * self.d_model)
        check_count(self.d_mlp, "d_mlp", 1)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads "
                             f"({self.n_heads})")


class HookPoint(nn.Module):
    """Identity module that names an activation, so forward hooks can read or replace it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Attention(nn.Module):
    """Multi-head self-attention with a fused ``qkv`` projection and an output ``proj``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_heads, self.causal = config.n_heads, config.causal
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.hook_pattern = HookPoint()  # (batch, heads, query, key) attention probabilities
        self.hook_z = HookPoint()  # (batch, time, d_model) heads concatenated, before proj
        mask = torch.ones(config.context, config.context, dtype=torch.bool).tril()
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=-1)
        q, k, v = (t.view(batch, time, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if self.causal:
            scores = scores.masked_fill(~self.mask[:time, :time], float("-inf"))
        pattern = self.hook_pattern(scores.softmax(dim=-1))
        z = (pattern @ v).transpose(1, 2).reshape(batch, time, width)
        return self.proj(self.hook_z(z))


class MLP(nn.Module):
    """``fc_out(gelu(fc_in(x)))``; ``hook_post`` sees the hidden activations."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc_in = nn.Linear(config.d_model, config.d_mlp)
        self.fc_out = nn.Linear(config.d_mlp, config.d_model)
        self.hook_post = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(self.hook_post(F.gelu(self.fc_in(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer block with hook points on the residual stream."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(config.d_model), nn.LayerNorm(config.d_model)
        self.attn, self.mlp = Attention(config), MLP(config)
        self.hook_resid_pre, self.hook_attn_out = HookPoint(), HookPoint()
        self.hook_resid_mid, self.hook_mlp_out = HookPoint(), HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.hook_resid_pre(x)
        x = self.hook_resid_mid(x + self.hook_attn_out(self.attn(self.ln1(x))))
        return self.hook_resid_post(x + self.hook_mlp_out(self.mlp(self.ln2(x))))


class TinyGPT(nn.Module):
    """A small GPT: ``forward(tokens)`` maps ``(batch, time)`` token ids to next-token logits.

    ``hook_final`` sees the final-LayerNorm output, the representation the untied ``lm_head``
    reads. Initialisation follows GPT-2 (normal with std 0.02, residual projections scaled by
    $1/\\sqrt{2L}$) and is deterministic given ``seed``.
    """

    def __init__(self, config: GPTConfig, seed: int = 0) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.context, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.hook_final = HookPoint()
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self._initialise(torch.Generator().manual_seed(int(seed)))

    def _initialise(self, generator: torch.Generator) -> None:
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layers)
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                std = residual_std if name.endswith(("attn.proj", "mlp.fc_out")) else 0.02
                nn.init.normal_(module.weight, 0.0, std, generator=generator)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.ndim != 2:
            raise ValueError(f"tokens must have shape (batch, time), got {tuple(tokens.shape)}")
        if tokens.shape[1] > self.config.context:
            raise ValueError(f"sequence length {tokens.shape[1]} exceeds the context "
                             f"{self.config.context}")
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.hook_final(self.ln_f(x)))

    @property
    def hook_names(self) -> list[str]:
        """Names of every :class:`HookPoint`, in execution order."""
        return [name for name, module in self.named_modules() if isinstance(module, HookPoint)]


# --- Hooks ----------------------------------------------------------------------------------


def _hook_modules(model: nn.Module, names: Iterable[str]) -> dict[str, nn.Module]:
    modules = dict(model.named_modules())
    missing = [name for name in names if not isinstance(modules.get(name), HookPoint)]
    if missing:
        valid = [n for n, m in modules.items() if isinstance(m, HookPoint)]
        raise ValueError(f"unknown hook points {missing}; valid names include {valid[:6]} ...")
    return {name: modules[name] for name in names}


@contextlib.contextmanager
def hooks(model: nn.Module,
          edits: Mapping[str, Callable[[torch.Tensor], torch.Tensor | None]]) -> Iterator[None]:
    """Inside the ``with`` block, hook point ``name`` passes its activation through ``fn``.

    ``fn`` returns the replacement activation, or ``None`` to leave it unchanged (to read it).
    """
    handles = []
    try:
        for name, module in _hook_modules(model, edits).items():
            fn = edits[name]
            handles.append(module.register_forward_hook(lambda _m, _i, out, fn=fn: fn(out)))
        yield
    finally:
        for handle in handles:
            handle.remove()


def run_with_cache(model: nn.Module, tokens: torch.Tensor,
                   names: Iterable[str] | None = None) -> tuple[torch.Tensor, dict]:
    """Logits and a ``{hook name: activation}`` cache (detached); ``names=None`` caches all."""
    if names is None:
        names = [n for n, m in model.named_modules() if isinstance(m, HookPoint)]
    cache: dict[str, torch.Tensor] = {}

    def recorder(name):
        def record(activation):
            cache[name] = activation.detach()
        return record

    with hooks(model, {name: recorder(name) for name in names}):
        logits = model(tokens)
    return logits, cache


def hidden_states(model: TinyGPT, tokens: torch.Tensor) -> torch.Tensor:
    """Residual stream after the embeddings and after every block: ``(L + 1, batch, time, d)``."""
    n_layers = len(model.blocks)
    names = ["blocks.0.hook_resid_pre"] + [f"blocks.{i}.hook_resid_post" for i in range(n_layers)]
    with torch.no_grad():
        _, cache = run_with_cache(model, tokens, names)
    return torch.stack([cache[name] for name in names])


def linear_layers(model: nn.Module, include_head: bool = False) -> dict[str, nn.Linear]:
    """The ``nn.Linear`` layers inside the blocks by name (plus ``lm_head`` if asked)."""
    return {name: module for name, module in model.named_modules()
            if isinstance(module, nn.Linear)
            and (name.startswith("blocks.") or (include_head and name == "lm_head"))}


def record_inputs(model: nn.Module, tokens: torch.Tensor,
                  names: Iterable[str]) -> dict[str, torch.Tensor]:
    """Inputs of the named modules on ``tokens``, flattened to ``(positions, in_features)``."""
    modules = dict(model.named_modules())
    names = list(names)
    unknown = [name for name in names if name not in modules]
    if unknown:
        raise ValueError(f"unknown modules {unknown}")
    inputs: dict[str, torch.Tensor] = {}
    handles = [modules[name].register_forward_pre_hook(
        lambda _m, args, name=name: inputs.__setitem__(name, args[0].detach().flatten(0, -2)))
        for name in names]
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        for handle in handles:
            handle.remove()
    return inputs


def replace_linears(model: nn.Module, factory: Callable[[str, nn.Linear], nn.Module],
                    names: Iterable[str] | None = None) -> list[str]:
    """Replace each named Linear (default: all of :func:`linear_layers`) by ``factory(name, it)``.

    The replacement must map ``(..., in_features)`` to ``(..., out_features)``. The model is
    changed in place; the replaced names are returned in order.
    """
    available = linear_layers(model, include_head=True)
    names = list(linear_layers(model) if names is None else names)
    unknown = [name for name in names if name not in available]
    if unknown:
        raise ValueError(f"not Linear layers of the model: {unknown}")
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, factory(name, available[name]))
    return names


# --- Training and evaluation ------------------------------------------------------------------


def as_token_tensor(sequences) -> torch.Tensor:
    """Token sequences (a 2-D integer array or tensor) as an int64 tensor."""
    tokens = torch.as_tensor(np.asarray(sequences) if not torch.is_tensor(sequences)
                             else sequences)
    if tokens.ndim != 2 or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise ValueError(f"sequences must be a 2-D integer array, got {tokens.dtype} with shape "
                         f"{tuple(tokens.shape)}")
    return tokens.long()


def random_windows(tokens: torch.Tensor, batch_size: int, context: int,
                   generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of inputs ``x`` and next-token targets ``y`` cut at random from ``tokens``."""
    count, length = tokens.shape
    if length < context + 1:
        raise ValueError(f"sequences of length {length} are too short for context {context}")
    rows = torch.randint(count, (batch_size,), generator=generator)
    starts = torch.randint(length - context, (batch_size,), generator=generator)
    index = starts[:, None] + torch.arange(context + 1)[None, :]
    window = tokens[rows[:, None], index]
    return window[:, :-1], window[:, 1:]


def next_token_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats) of the model's next-token predictions."""
    logits = model(x)
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def distillation_loss(teacher: nn.Module, temperature: float = 1.0) -> Callable:
    """Loss ``KL(teacher || student)`` on the next-token distributions, at ``temperature``.

    Multiplied by ``temperature**2`` so that gradients keep their scale (Hinton et al.).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            target = F.log_softmax(teacher(x) / temperature, dim=-1)
        student = F.log_softmax(model(x) / temperature, dim=-1)
        kl = F.kl_div(student.flatten(0, 1), target.flatten(0, 1), log_target=True,
                      reduction="batchmean")
        return kl * temperature**2

    return loss


def cosine_schedule(step: int, steps: int, warmup: int, floor: float = 0.1) -> float:
    """Learning-rate multiplier: linear warm-up, then cosine decay from 1 to ``floor``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass
class TrainResult:
    """Training losses per step and the paths of saved checkpoints."""

    losses: list[float] = field(default_factory=list)
    checkpoints: list[Path] = field(default_factory=list)


class AdamW:
    """AdamW with torch's defaults (betas 0.9, 0.999; eps 1e-8), the update of
    ``torch.optim.AdamW(foreach=False)`` written out.

    Constructing a ``torch.optim`` optimiser imports torch's compiler stack once per process
    (seconds of CPU), which dominates the smoke tier of chapters that train small models; they
    use this one. The unit tests check the update against ``torch.optim.AdamW`` step by step
    (``weight_decay=0`` is Adam).
    """

    def __init__(self, params, lr: float, weight_decay: float = 0.0,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.params = [p for p in params]
        if not self.params:
            raise ValueError("no parameters to optimise")
        if not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"lr must be positive and finite, got {lr}")
        self.lr, self.weight_decay, self.betas, self.eps = lr, weight_decay, betas, eps
        self.steps = 0
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self, lr: float | None = None) -> None:
        """One update; ``lr`` overrides the learning rate for this step (schedules)."""
        lr = self.lr if lr is None else lr
        beta1, beta2 = self.betas
        self.steps += 1
        correction1 = 1 - beta1 ** self.steps
        correction2_sqrt = math.sqrt(1 - beta2 ** self.steps)
        for p, m, v in zip(self.params, self.m, self.v, strict=True):
            if p.grad is None:
                continue
            grad = p.grad
            p.mul_(1 - lr * self.weight_decay)
            m.lerp_(grad, 1 - beta1)
            v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            p.addcdiv_(m, (v.sqrt() / correction2_sqrt).add_(self.eps), value=-lr / correction1)


def stack_models(models: Sequence[nn.Module]) -> dict[str, torch.Tensor]:
    """The parameters of ``models`` (one architecture) stacked along a new leading axis."""
    if not models:
        raise ValueError("need at least one model")
    named = [dict(m.named_parameters()) for m in models]
    return {name: torch.stack([p[name].detach() for p in named]).clone() for name in named[0]}


def stacked_logits(template: nn.Module, params: dict[str, torch.Tensor],
                   tokens: torch.Tensor) -> torch.Tensor:
    """Logits of every stacked replicate on its own tokens ``(R, batch, time)``."""
    from torch.func import functional_call, vmap

    return vmap(lambda p, x: functional_call(template, p, (x,)))(params, tokens)


def unstack(template: nn.Module, params: dict[str, torch.Tensor], index: int) -> nn.Module:
    """An ordinary model holding replicate ``index`` of stacked ``params``, in eval mode."""
    model = copy.deepcopy(template)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(params[name][index])
    return model.eval()


def stacked_fit(params: dict[str, torch.Tensor], loss_of, *, steps: int, lr: float,
                grad_clip: float = 1.0) -> torch.Tensor:
    """Train stacked ``params`` in place with one loss per replicate; return losses ``(steps, R)``.

    ``loss_of(params, step)`` returns the ``R`` losses. Each replicate gets Adam's update (as
    :class:`AdamW` without weight decay), warm-up over a tenth of the steps and cosine decay
    (:func:`cosine_schedule`), and its own gradient clipped at norm ``grad_clip``, so R replicates
    train as R independent runs would, in one batched pass per step.
    """
    steps = check_count(steps, "steps", 1)
    names = list(params)
    for name in names:
        params[name].requires_grad_(True)
    count = params[names[0]].shape[0]
    moments = {n: torch.zeros_like(params[n]) for n in names}
    squares = {n: torch.zeros_like(params[n]) for n in names}
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    warmup = max(1, steps // 10)
    losses = torch.empty(steps, count)
    for step in range(steps):
        per = loss_of(params, step)
        grads = torch.autograd.grad(per.sum(), [params[n] for n in names])
        with torch.no_grad():
            norms = torch.sqrt(sum(g.pow(2).flatten(1).sum(1) for g in grads))
            factor = (grad_clip / (norms + 1e-6)).clamp(max=1.0)
            rate = lr * cosine_schedule(step, steps, warmup)
            c1, c2 = 1 - beta1 ** (step + 1), math.sqrt(1 - beta2 ** (step + 1))
            for name, grad in zip(names, grads, strict=True):
                shape = (count,) + (1,) * (grad.ndim - 1)
                grad = grad * factor.reshape(shape)
                moments[name].lerp_(grad, 1 - beta1)
                squares[name].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                params[name].sub_(moments[name] / (squares[name].sqrt() / c2).add_(eps)
                                  * (rate / c1))
        losses[step] = per.detach()
    for name in names:
        params[name].requires_grad_(False)
    return losses


def train(model: nn.Module, sequences, *, steps: int, batch_size: int = 32, lr: float = 3e-3,
          loss: Callable | None = None, params: Iterable[torch.nn.Parameter] | None = None,
          weight_decay: float = 0.0, warmup: int | None = None, grad_clip: float | None = 1.0,
          seed: int = 0, callback: Callable[[int, nn.Module], None] | None = None,
          checkpoint_dir: str | Path | None = None,
          checkpoint_every: int | None = None) -> TrainResult:
    """Train ``model`` with AdamW on random windows of ``sequences`` for ``steps`` steps.

    ``loss(model, x, y)`` defaults to :func:`next_token_loss`; ``params`` defaults to every
    parameter that requires a gradient. ``callback(step, model)`` runs after every step. With
    ``checkpoint_dir`` and ``checkpoint_every``, a checkpoint is saved every that many steps
    (and after the last). The batches depend only on ``seed``.
    """
    steps = check_count(steps, "steps", 1)
    tokens = as_token_tensor(sequences)
    loss = next_token_loss if loss is None else loss
    params = [p for p in (model.parameters() if params is None else params) if p.requires_grad]
    if not params:
        raise ValueError("no trainable parameters")
    warmup = max(1, steps // 10) if warmup is None else warmup
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: cosine_schedule(step, steps, warmup))
    generator = torch.Generator().manual_seed(int(seed))
    context = model.config.context if hasattr(model, "config") else tokens.shape[1] - 1
    result = TrainResult()
    model.train()
    for step in range(steps):
        x, y = random_windows(tokens, batch_size, context, generator)
        value = loss(model, x, y)
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
        optimizer.step()
        scheduler.step()
        result.losses.append(value.item())
        if callback is not None:
            callback(step, model)
        if checkpoint_dir is not None and checkpoint_every and (
                (step + 1) % checkpoint_every == 0 or step + 1 == steps):
            path = Path(checkpoint_dir) / f"step-{step + 1:06d}.pt"
            result.checkpoints.append(save_checkpoint(model, path, step=step + 1))
    model.eval()
    return result


def evaluate_nll(model: nn.Module, sequences, min_context: int = 0,
                 batch_size: int = 256) -> float:
    """Mean next-token loss (nats) over every target with ``>= min_context`` tokens before it.

    Each sequence is cut into windows of ``context + 1`` tokens that overlap just enough for
    every target from position ``min_context`` on to be scored exactly once, with at least
    ``min_context`` tokens of its window before it. For an order-$k$ Markov source,
    ``min_context=k`` makes the entropy rate the exact floor.
    """
    tokens = as_token_tensor(sequences)
    context = model.config.context
    length = tokens.shape[1]
    if min_context < 0 or min_context >= min(context, length):
        raise ValueError(f"min_context {min_context} leaves no targets (context {context}, "
                         f"sequence length {length})")
    skip = max(min_context - 1, 0)  # the target at window position t has t + 1 tokens before it
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for start in range(0, length - 1 - skip, context - skip):
            window = tokens[:, start:start + context + 1]
            for batch in window.split(batch_size):
                logits = model(batch[:, :-1])[:, skip:]
                targets = batch[:, 1:][:, skip:]
                total += F.cross_entropy(logits.flatten(0, 1), targets.flatten(),
                                         reduction="sum").item()
                count += targets.numel()
    return total / count


def count_parameters(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of (trainable) parameter elements."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


# --- Checkpoints ----------------------------------------------------------------------------


def save_checkpoint(model: TinyGPT, path: str | Path, **metadata) -> Path:
    """Save the config, the weights and JSON-like ``metadata`` of a :class:`TinyGPT`."""
    if not isinstance(model, TinyGPT):
        raise TypeError(f"only TinyGPT models can be checkpointed, got {type(model).__name__}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"config": asdict(model.config), "state_dict": model.state_dict(),
                "metadata": metadata}, path)
    return path


def load_checkpoint(path: str | Path) -> tuple[TinyGPT, dict]:
    """The :class:`TinyGPT` saved at ``path`` (in eval mode) and its metadata."""
    payload = torch.load(Path(path), weights_only=True)
    model = TinyGPT(GPTConfig(**payload["config"]))
    model.load_state_dict(payload["state_dict"])
    return model.eval(), payload["metadata"]
