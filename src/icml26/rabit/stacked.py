r"""Training several replicates of one architecture at once: stacked parameters under ``vmap``.

Replicates (different full-precision models, calibration batches, batch orders, learning rates)
share one architecture, so their parameters can be stacked along a new leading axis and one
forward pass evaluates them all: :func:`torch.func.functional_call` runs the module with one
replicate's parameters, and :func:`torch.func.vmap` maps it over the stack. The loss is the sum
of the replicates' losses, so backpropagation gives every replicate its own gradient. Gradient
clipping and Adam act per replicate (their state has the same leading axis), and the learning
rate may differ between replicates. A small model spends most of a step in Python and autograd
overhead, which the stack pays once for all replicates.

:func:`train_stacked` reproduces :func:`icml26.nn.train` (AdamW without weight decay, warm-up
and cosine decay, clipping at norm 1, batches drawn by :func:`icml26.nn.random_windows` from
each replicate's seed) for every replicate; the unit tests check it against independent runs.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.nn import functional as F  # noqa: N812

from icml26 import nn as tnn
from icml26.core import check_count


def stack_parameters(models: Sequence[nn.Module]) -> tuple[dict[str, torch.Tensor],
                                                            dict[str, torch.Tensor]]:
    """Stacked trainable and fixed parameters of ``models`` (same architecture), by name.

    A parameter is trainable when it requires a gradient in the first model.
    """
    if not models:
        raise ValueError("need at least one model")
    names = [name for name, _ in models[0].named_parameters()]
    for model in models[1:]:
        if [name for name, _ in model.named_parameters()] != names:
            raise ValueError("the models have different parameters")
    params = [dict(model.named_parameters()) for model in models]
    trainable, fixed = {}, {}
    for name in names:
        stacked = torch.stack([p[name].detach() for p in params]).clone()
        if params[0][name].requires_grad:
            trainable[name] = stacked.requires_grad_(True)
        else:
            fixed[name] = stacked
    return trainable, fixed


def stacked_forward(template: nn.Module, params: dict[str, torch.Tensor],
                    tokens: torch.Tensor, shared_tokens: bool = False) -> torch.Tensor:
    """Logits of every replicate: ``tokens`` is ``(R, batch, time)``, or ``(batch, time)`` for
    all replicates when ``shared_tokens``."""
    def one(replicate_params, x):
        return functional_call(template, replicate_params, (x,))

    return vmap(one, in_dims=(0, None if shared_tokens else 0))(params, tokens)


def replicate(template: nn.Module, params: dict[str, torch.Tensor], index: int) -> nn.Module:
    """An ordinary module holding replicate ``index`` of the stacked ``params``."""
    model = copy.deepcopy(template)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name in params:
                parameter.copy_(params[name][index])
    return model.eval()


def stacked_nll(template: nn.Module, params: dict[str, torch.Tensor], sequences,
                min_context: int = 0, batch_size: int = 256) -> torch.Tensor:
    """:func:`icml26.nn.evaluate_nll` for every replicate at once: a tensor of ``R`` losses."""
    tokens = tnn.as_token_tensor(sequences)
    context = template.config.context
    length = tokens.shape[1]
    if min_context < 0 or min_context >= min(context, length):
        raise ValueError(f"min_context {min_context} leaves no targets")
    skip = max(min_context - 1, 0)
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, length - 1 - skip, context - skip):
            window = tokens[:, start:start + context + 1]
            for batch in window.split(batch_size):
                logits = stacked_forward(template, params, batch[:, :-1], shared_tokens=True)
                targets = batch[:, 1:][:, skip:]
                logits = logits[:, :, skip:]
                losses = F.cross_entropy(logits.flatten(1, 2).transpose(1, 2),
                                         targets.flatten()[None].expand(logits.shape[0], -1),
                                         reduction="none")
                total = total + losses.double().sum(1)
                count += targets.numel()
    return total / count


def train_stacked(template: nn.Module, trainable: dict[str, torch.Tensor],
                  fixed: dict[str, torch.Tensor], sequences, *, steps: int, lrs, seeds,
                  batch_size: int = 32, teacher: tuple[nn.Module, dict[str, torch.Tensor]]
                  | None = None, warmup: int | None = None, grad_clip: float | None = 1.0,
                  callback: Callable[[int], None] | None = None) -> torch.Tensor:
    """Train the stacked ``trainable`` parameters in place; return the losses ``(steps, R)``.

    ``sequences`` is one token array shared by all replicates, or a list of ``R`` arrays.
    Replicate ``r`` draws its batches from ``seeds[r]`` and trains at ``lrs[r]``. With
    ``teacher = (teacher_template, teacher_params)`` (stacked like the student, or ``None`` for
    one teacher shared by every replicate) the loss is
    KL(teacher || student) (:func:`icml26.nn.distillation_loss`); without, the next-token
    cross-entropy. ``callback(step)`` runs after every update.
    """
    steps = check_count(steps, "steps", 1)
    count = next(iter(trainable.values())).shape[0]
    lrs = torch.as_tensor(lrs, dtype=torch.float32).reshape(-1)
    if lrs.numel() == 1:
        lrs = lrs.expand(count)
    seeds = list(seeds)
    if lrs.numel() != count or len(seeds) != count:
        raise ValueError(f"need one learning rate and one seed per replicate ({count})")
    token_sets = (list(sequences) if isinstance(sequences, (list, tuple))
                  else [sequences] * count)
    token_sets = [tnn.as_token_tensor(t) for t in token_sets]
    if len(token_sets) != count:
        raise ValueError(f"need one token array per replicate ({count})")
    generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
    context = template.config.context
    warmup = max(1, steps // 10) if warmup is None else warmup
    names = list(trainable)
    moments = {n: torch.zeros_like(trainable[n]) for n in names}
    squares = {n: torch.zeros_like(trainable[n]) for n in names}
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    losses = torch.empty(steps, count)
    template.train()
    for step in range(steps):
        windows = [tnn.random_windows(t, batch_size, context, g)
                   for t, g in zip(token_sets, generators, strict=True)]
        x = torch.stack([w[0] for w in windows])
        y = torch.stack([w[1] for w in windows])
        logits = stacked_forward(template, {**fixed, **trainable}, x)
        if teacher is None:
            per = F.cross_entropy(logits.flatten(1, 2).transpose(1, 2), y.flatten(1),
                                  reduction="none").mean(1)
        else:
            with torch.no_grad():
                if teacher[1] is None:  # one teacher shared by every replicate
                    target = teacher[0](x.flatten(0, 1)).reshape(logits.shape)
                else:
                    target = stacked_forward(teacher[0], teacher[1], x)
                target = F.log_softmax(target, dim=-1)
            student = F.log_softmax(logits, dim=-1)
            per = (target.exp() * (target - student)).sum(-1).flatten(1).mean(1)
        grads = torch.autograd.grad(per.sum(), [trainable[n] for n in names])
        with torch.no_grad():
            if grad_clip is not None:
                norms = torch.sqrt(sum(g.pow(2).flatten(1).sum(1) for g in grads))
                factor = (grad_clip / (norms + 1e-6)).clamp(max=1.0)
            else:
                factor = torch.ones(count)
            rate = lrs * tnn.cosine_schedule(step, steps, warmup)
            correction1 = 1 - beta1 ** (step + 1)
            correction2 = math.sqrt(1 - beta2 ** (step + 1))
            for name, grad in zip(names, grads, strict=True):
                shape = (count,) + (1,) * (grad.ndim - 1)
                grad = grad * factor.reshape(shape)
                moments[name].lerp_(grad, 1 - beta1)
                squares[name].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                denominator = (squares[name].sqrt() / correction2).add_(eps)
                trainable[name].sub_(moments[name] / denominator
                                     * (rate / correction1).reshape(shape))
        losses[step] = per.detach()
        if callback is not None:
            callback(step)
    template.eval()
    return losses
