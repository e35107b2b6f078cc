r"""Tiny transformers trained on synthetic languages whose entropy is a knob, with checkpoints.

Built on the shared blocks :mod:`icml26.language` (Zipfian Markov sources with an exact entropy
rate) and :mod:`icml26.nn` (a tiny GPT with hook points and a training loop). Each checkpoint is
measured layer by layer with :mod:`icml26.anisotropy.metrics` and, at chosen layers, with the
tangent-proxy test of :mod:`icml26.anisotropy.tangent`.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 (the usual torch alias)

from icml26 import language
from icml26 import nn as tnn
from icml26.anisotropy import metrics, tangent

TEMPERATURES = (0.2, 50.0)
"""Temperature bracket of :func:`entropy_sources` (below 0.2 some chains mix too slowly for the
stationary distribution of :func:`icml26.language.zipf_markov_source` to converge)."""


def entropy_sources(fractions: Sequence[float], vocab_size: int = 64, order: int = 1,
                    seed: int = 0, tol: float = 1e-6) -> list[language.MarkovSource]:
    r"""One Zipfian Markov source per entropy rate $f \log V$, for each fraction $f \in (0, 1)$.

    The temperature is found by bisection on $\log T$ within :data:`TEMPERATURES`. The sources
    share their rankings and temperature spread (they depend only on ``seed``), so they differ
    only in the temperature that sets the entropy rate.
    """
    fractions = list(fractions)
    if not fractions or any(not isinstance(f, numbers.Real) or not 0 < f < 1 for f in fractions):
        raise ValueError(f"entropy fractions must be numbers in (0, 1), got {fractions}")

    def source(log_temperature: float) -> language.MarkovSource:
        return language.zipf_markov_source(vocab_size, order, temperature=float(
            np.exp(log_temperature)), seed=seed)

    low, high = np.log(TEMPERATURES)
    lowest, highest = source(low).entropy_rate, source(high).entropy_rate
    sources = []
    for fraction in fractions:
        target = fraction * np.log(vocab_size)
        if not lowest <= target <= highest:
            raise ValueError(f"entropy fraction {fraction} is outside the reachable range "
                             f"[{lowest / np.log(vocab_size):.3f}, "
                             f"{highest / np.log(vocab_size):.3f}] for seed {seed}")
        a, b = low, high
        while b - a > tol:
            middle = 0.5 * (a + b)
            a, b = (middle, b) if source(middle).entropy_rate < target else (a, middle)
        sources.append(source(0.5 * (a + b)))
    return sources


def train_with_checkpoints(model: tnn.TinyGPT, sequences, directory: str | Path, *,
                           steps: int, checkpoint_steps: Iterable[int], seed: int = 0,
                           **train_options) -> dict[int, Path]:
    """Train ``model`` with :func:`icml26.nn.train`, saving it at step 0 and at each listed step.

    Returns ``{step: checkpoint path}``. Checkpoint steps must lie in ``[1, steps]``; extra
    keyword arguments (``lr``, ``batch_size``, ...) go to the training loop.
    """
    wanted = sorted(set(int(step) for step in checkpoint_steps))
    if not wanted or wanted[0] < 1 or wanted[-1] > steps:
        raise ValueError(f"checkpoint steps must lie in [1, {steps}], got {wanted}")
    directory = Path(directory)
    paths = {0: tnn.save_checkpoint(model, directory / "step-000000.pt", step=0)}

    def save(step: int, trained: tnn.TinyGPT) -> None:
        if step + 1 in wanted:
            path = directory / f"step-{step + 1:06d}.pt"
            paths[step + 1] = tnn.save_checkpoint(trained, path, step=step + 1)

    tnn.train(model, sequences, steps=steps, seed=seed, callback=save, **train_options)
    return paths


def train_stacked(models: Sequence[tnn.TinyGPT], corpora: Sequence, *, steps: int,
                  seeds: Sequence[int], batch_size: int = 32, lr: float = 3e-3,
                  grad_clip: float | None = 1.0,
                  checkpoints: Sequence[tuple[str | Path, Iterable[int]] | None] | None = None,
                  transforms: Sequence[Callable | None] | None = None,
                  vectorise: bool = False) -> list[dict[int, Path]]:
    r"""Train several TinyGPTs of one configuration at once, as one stacked model
    (``torch.func.vmap`` over their parameters): the update of :func:`icml26.nn.train` for each
    (AdamW without weight decay, warm-up then cosine learning rate, gradient clipping per model,
    batches drawn from ``corpora[i]`` with a generator seeded by ``seeds[i]``).

    ``checkpoints[i]`` is ``(directory, steps)`` or ``None``: model ``i`` is saved at step 0 and
    at those steps, as :func:`train_with_checkpoints` does. ``transforms[i](x, y)`` may replace a
    batch before the loss (an encoder's masking). The models are left trained, in eval mode.
    Returns one ``{step: path}`` per model (empty without checkpoints).

    With ``vectorise=False`` (the default) the models train one after the other through the same
    code: at the book's sizes (d = 32, one CPU thread) training is compute-bound, vmap saved no CPU
    per model-step (0.0151 s stacked against 0.0148 s alone) and its first call costs about a
    second. ``vectorise=True`` is for wider hardware (several threads, a GPU).
    """
    from torch.func import functional_call, stack_module_state, vmap

    count = len(models)
    if count < 1 or len(corpora) != count or len(seeds) != count:
        raise ValueError("models, corpora and seeds must be non-empty and of the same length")
    steps = int(steps)
    if steps < 1:
        raise ValueError(f"steps must be positive, got {steps}")
    checkpoints = [None] * count if checkpoints is None else list(checkpoints)
    transforms = [None] * count if transforms is None else list(transforms)
    if count > 1 and not vectorise:
        return [train_stacked([model], [corpus], steps=steps, seeds=[seed],
                              batch_size=batch_size, lr=lr, grad_clip=grad_clip,
                              checkpoints=[spec], transforms=[transform])[0]
                for model, corpus, seed, spec, transform in zip(
                    models, corpora, seeds, checkpoints, transforms, strict=True)]
    paths: list[dict[int, Path]] = [{} for _ in range(count)]
    wanted: list[set[int]] = []
    for i, spec in enumerate(checkpoints):
        if spec is None:
            wanted.append(set())
            continue
        directory, chosen = Path(spec[0]), sorted(set(int(s) for s in spec[1]))
        if not chosen or chosen[0] < 1 or chosen[-1] > steps:
            raise ValueError(f"checkpoint steps must lie in [1, {steps}], got {chosen}")
        wanted.append(set(chosen))
        paths[i][0] = tnn.save_checkpoint(models[i], directory / "step-000000.pt", step=0)
    tokens = [tnn.as_token_tensor(c) for c in corpora]
    generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
    context = models[0].config.context
    template = models[0]
    names = [n for n, p in template.named_parameters() if p.requires_grad]
    for model in models:
        model.train()
    params, buffers = stack_module_state(list(models))
    trainable = {n: params[n].detach().clone().requires_grad_(True) for n in names}
    fixed = {n: v.detach() for n, v in params.items() if n not in trainable}
    fixed.update({n: v.detach() for n, v in buffers.items()})

    def loss_of(weights, others, x, y):
        logits = functional_call(template, {**weights, **others}, (x,))
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())

    # vmap of the forward pass and ordinary autograd on the sum of the models' losses: model i's
    # parameters get the gradient of its own loss (torch.func.grad would import torch._dynamo,
    # seconds of CPU).
    stacked_loss = vmap(loss_of)
    if count == 1:  # one model: train its own parameters
        trainable = {n: template.get_parameter(n) for n in names}
    ordered = [trainable[n] for n in names]
    optimizer = tnn.AdamW(ordered, lr=lr)
    warmup = max(1, steps // 10)

    def unstack(step: int) -> None:
        for i, model in enumerate(models):
            if step in wanted[i] or step == steps:
                if count > 1:
                    with torch.no_grad():
                        for n in names:
                            model.get_parameter(n).copy_(trainable[n][i])
                if step in wanted[i]:
                    directory = Path(checkpoints[i][0])
                    paths[i][step] = tnn.save_checkpoint(
                        model, directory / f"step-{step:06d}.pt", step=step)

    for step in range(steps):
        batches = [tnn.random_windows(t, batch_size, context, g)
                   for t, g in zip(tokens, generators, strict=True)]
        batches = [(x, y) if f is None else f(x, y)
                   for (x, y), f in zip(batches, transforms, strict=True)]
        x = torch.stack([b[0] for b in batches])
        y = torch.stack([b[1] for b in batches])
        optimizer.zero_grad()
        if count == 1:  # one model: its own forward pass, without functional_call's overhead
            F.cross_entropy(template(x[0]).flatten(0, 1), y[0].flatten()).backward()
        else:
            stacked_loss(trainable, fixed, x, y).sum().backward()
        if grad_clip is not None:
            with torch.no_grad():
                if count == 1:
                    torch.nn.utils.clip_grad_norm_(ordered, grad_clip)
                else:
                    norms = torch.stack([p.grad.flatten(1).pow(2).sum(1)
                                         for p in ordered]).sum(0)
                    scale = (grad_clip / (norms.sqrt() + 1e-6)).clamp(max=1.0)
                    for p in ordered:
                        p.grad.mul_(scale.view(-1, *[1] * (p.ndim - 1)))
        optimizer.step(lr=lr * tnn.cosine_schedule(step, steps, warmup))
        unstack(step + 1)
    for model in models:
        model.eval()
    return paths


def evaluation_batch(sequences, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets from the first ``context + 1`` tokens of each sequence."""
    tokens = tnn.as_token_tensor(sequences)
    if tokens.shape[1] < context + 1:
        raise ValueError(f"sequences of length {tokens.shape[1]} are too short for context "
                         f"{context}")
    return tokens[:, :context], tokens[:, 1:context + 1]


def mask_tokens(x: torch.Tensor, mask_id: int, rate: float,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked-language-model inputs and targets: a random ``rate`` of the tokens of ``x`` become
    ``mask_id`` and are the only targets (the others get the ignored target -100)."""
    if not 0 < rate < 1:
        raise ValueError(f"mask rate must lie in (0, 1), got {rate}")
    masked = torch.rand(x.shape, generator=generator) < rate
    masked[:, 0] |= ~masked.any(dim=1)  # at least one target per sequence
    return x.masked_fill(masked, mask_id), x.masked_fill(~masked, -100)


def masked_token_loss(mask_id: int, rate: float = 0.15, seed: int = 0) -> Callable:
    """Training loss of an encoder (bidirectional attention): predict the masked tokens.

    For :func:`icml26.nn.train`: ``loss(model, x, y)`` ignores the next-token targets ``y``.
    """
    generator = torch.Generator().manual_seed(seed)

    def loss(model: tnn.TinyGPT, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        inputs, targets = mask_tokens(x, mask_id, rate, generator)
        return F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())

    return loss


def layer_names(n_layers: int) -> list[str]:
    """Names of the residual-stream states: the embeddings, then the output of each block."""
    return ["embed"] + [f"block {i + 1}" for i in range(n_layers)]


def _hook_name(layer: int) -> str:
    return "blocks.0.hook_resid_pre" if layer == 0 else f"blocks.{layer - 1}.hook_resid_post"


def layer_states(model: tnn.TinyGPT, x: torch.Tensor) -> list[np.ndarray]:
    """Residual stream at every layer (embeddings first), each flattened to ``(positions, d)``."""
    states = tnn.hidden_states(model, x)
    return [state.flatten(0, 1).double().numpy() for state in states]


def activations_and_gradients(model: tnn.TinyGPT, x: torch.Tensor, y: torch.Tensor,
                              layer: int) -> tuple[np.ndarray, np.ndarray]:
    r"""Residual stream $H$ at ``layer`` and the gradient $G = \partial L / \partial H$.

    $L$ is the cross-entropy summed over the positions whose target is not -100 (all of them for
    next-token targets, the masked ones for an encoder). $G$ is taken with respect to the
    activations, not the parameters.
    """
    if not 0 <= layer <= model.config.n_layers:
        raise ValueError(f"layer must lie in [0, {model.config.n_layers}], got {layer}")
    kept: dict[str, torch.Tensor] = {}

    def keep(activation: torch.Tensor) -> None:
        activation.retain_grad()
        kept["activation"] = activation

    was_training = model.training
    model.eval()
    with tnn.hooks(model, {_hook_name(layer): keep}):
        logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum")
        loss.backward()
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    activation = kept["activation"]
    return (activation.detach().flatten(0, 1).double().numpy(),
            activation.grad.flatten(0, 1).double().numpy())


def tangent_test(H, G, k: int = 8, seed: int = 0) -> dict[str, float]:
    """The tangent-proxy test at one layer: semi-NMF and PCA proxies against the normal control.

    ``energy`` is $E(Q_T)$, ``control`` the matched normal control's mean share, ``ratio`` their
    quotient, ``enrichment`` is $E(Q_T) / (k/d)$; ``aniso_share`` and ``aniso_control`` are the
    shares of gradient anisotropy; ``pca_ratio`` is the ratio for the PCA proxy.
    """
    _, D = tangent.semi_nmf(H, k, seed=seed)
    Q = tangent.orthonormal_basis(D)
    energy, control = tangent.energy_share(G, Q), tangent.control_energy_share(G, Q)
    share, share_control = tangent.anisotropy_share(G, Q)
    P = tangent.pca_basis(H, k)
    return {
        "energy": energy,
        "control": control,
        "ratio": energy / control,
        "enrichment": energy / (k / Q.shape[0]),
        "aniso_share": share,
        "aniso_control": share_control,
        "pca_ratio": tangent.energy_share(G, P) / tangent.control_energy_share(G, P),
    }


def measure_checkpoint(path: str | Path, x: torch.Tensor, y: torch.Tensor,
                       tangent_layers: Iterable[int] = (), k: int = 8,
                       seed: int = 0) -> list[dict]:
    """One record per layer of the checkpoint at ``path``: every metric, plus the tangent test
    at the layers listed in ``tangent_layers``."""
    model, info = tnn.load_checkpoint(path)
    tangent_layers = set(tangent_layers)
    if not tangent_layers <= set(range(model.config.n_layers + 1)):
        raise ValueError(f"tangent layers must lie in [0, {model.config.n_layers}], "
                         f"got {sorted(tangent_layers)}")
    records = []
    for layer, (name, H) in enumerate(zip(layer_names(model.config.n_layers),
                                          layer_states(model, x), strict=True)):
        record = {"step": info["step"], "layer": layer, "layer_name": name,
                  **metrics.all_metrics(H)}
        if layer in tangent_layers:
            H_grad, G = activations_and_gradients(model, x, y, layer)
            record.update(tangent_test(H_grad, G, k, seed))
        records.append(record)
    return records
