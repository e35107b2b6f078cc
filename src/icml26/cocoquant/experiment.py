r"""Sensitivity calibration and the measured loss of a precision configuration.

The calibration ({eq}`eq-ccq-sensitivity`) quantises one site at a time and records the change
of the mean next-token loss on a calibration split, relative to the reference configuration
(every GEMM unquantised, float16 communication):

$$\Delta_{s,o} = \mathrm{NLL}(\text{reference with site } s \text{ at } o) - \mathrm{NLL}
(\text{reference}).$$

The allocation then assumes these add up ({eq}`eq-ccq-additive`); :func:`additivity_ratio`
measures how well that holds on held-out data.

:func:`window_nll` scores one configuration per window. Given the source that generated the
text (a Markov chain with a known transition table), it scores each position by the *expected*
loss under the true next-token distribution, $-\sum_y P(y \mid c) \log q(y)$
({eq}`eq-ccq-expected-nll`): the same mean as the loss on the sampled tokens, without the noise of
sampling them. :func:`calibrate_sets` calibrates on several disjoint calibration sets at once and
returns each set's sensitivities with their standard errors; :func:`floored` turns them into
the noise-floored costs the allocation uses ({eq}`eq-ccq-floor`), :func:`equal_sensitivities`
into the sensitivity-blind costs of the baseline.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F  # noqa: N812

from icml26.cocoquant.tp import (
    batch_nll,
    check_config,
    simulate_logits,
    site_kind,
    site_names,
    site_options,
    uniform_config,
)
from icml26.core import check_count
from icml26.nn import TinyGPT


def reference_config(n_layers: int) -> dict[str, str]:
    """Every GEMM unquantised, every all-reduce in float16."""
    return uniform_config(n_layers)


def calibrate(model: TinyGPT, windows: torch.Tensor, world_size: int = 2,
              min_context: int = 0, sites=None) -> dict[tuple[str, str], float]:
    """$\\Delta_{s,o}$ of {eq}`eq-ccq-sensitivity` for every site and non-reference option."""
    n_layers = model.config.n_layers
    base = reference_config(n_layers)
    reference = batch_nll(model, windows, base, 1, world_size, min_context)[0]
    out = {}
    for site in site_names(n_layers) if sites is None else sites:
        for option in site_options(site)[1:]:
            config = dict(base, **{site: option})
            nll = batch_nll(model, windows, config, 1, world_size, min_context)[0]
            out[site, option] = float(nll - reference)
    return out


def relative(sensitivity: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    """Sensitivities divided by their total at each site's most aggressive option.

    A budget of 1 then allows, under additivity, the damage of quantising everything as far as
    possible; budgets become comparable across models.
    """
    sites = {site for site, _ in sensitivity}
    total = sum(sensitivity.get((s, site_options(s)[-1]), 0.0) for s in sites)
    if total <= 0:
        raise ValueError("the most aggressive options do not increase the loss in total; "
                         "relative sensitivities are undefined")
    return {key: value / total for key, value in sensitivity.items()}


def additivity_ratio(measured_delta: float, predicted_delta: float) -> float:
    """Measured loss increase over the additive prediction ({eq}`eq-ccq-additive`)."""
    if predicted_delta <= 0:
        raise ValueError(f"the predicted loss increase must be positive, got {predicted_delta}")
    return float(measured_delta / predicted_delta)


def perplexity_gap(nll_config: np.ndarray, nll_reference: np.ndarray) -> np.ndarray:
    """Per-batch perplexity of a configuration minus that of the reference (paired batches)."""
    return np.exp(np.asarray(nll_config)) - np.exp(np.asarray(nll_reference))


def window_nll(model: TinyGPT, windows: torch.Tensor, config: dict[str, str],
               world_size: int = 2, min_context: int = 0, source=None,
               chunk: int = 128) -> np.ndarray:
    r"""Mean next-token loss (nats) of the quantised model on each window: shape ``(n,)``.

    ``windows`` is ``(n, context + 1)``; targets with fewer than ``min_context`` tokens before
    them are not scored. With ``source`` (an object with ``order``, ``transition`` and
    ``encode``, such as :class:`icml26.language.MarkovSource`) each position is scored by its
    expected loss $-\sum_y P(y \mid c)\log q(y)$ under the source's next-token distribution
    ({eq}`eq-ccq-expected-nll`); ``min_context`` must then be at least the source's order.
    """
    windows = torch.as_tensor(windows).long()
    if windows.ndim != 2 or windows.shape[1] < 2:
        raise ValueError(f"windows must be (n, length >= 2), got {tuple(windows.shape)}")
    min_context = check_count(min_context, "min_context", 0)
    chunk = check_count(chunk, "chunk", 1)
    if source is not None and min_context < source.order:
        raise ValueError(f"expected losses need min_context >= the source order "
                         f"{source.order}, got {min_context}")
    if min_context >= windows.shape[1] - 1:
        raise ValueError(f"min_context {min_context} leaves no scored position in windows of "
                         f"{windows.shape[1]} tokens")
    config = check_config(config, model.config.n_layers)
    skip = max(min_context - 1, 0)
    out = []
    for block in torch.split(windows, chunk):
        inputs = block[:, :-1]
        logp = simulate_logits(model, inputs, config, world_size)[:, skip:].log_softmax(-1)
        if source is None:
            targets = block[:, 1:][:, skip:]
            loss = F.nll_loss(logp.transpose(1, 2), targets, reduction="none")
        else:
            k, length = source.order, inputs.shape[1]
            # the context of the target after input position t is inputs[t-k+1 .. t]
            ctx = torch.stack([inputs[:, skip - k + 1 + j: length - k + 1 + j]
                               for j in range(k)], dim=-1)
            codes = torch.as_tensor(source.encode(ctx.numpy()))
            probs = torch.as_tensor(source.transition, dtype=logp.dtype)[codes]
            loss = -(probs * logp).sum(-1)
        out.append(loss.mean(dim=1).numpy())
    return np.concatenate(out)


def calibrate_sets(model: TinyGPT, sets: list[torch.Tensor], world_size: int = 2,
                   min_context: int = 0, source=None) -> tuple[list[dict], list[dict]]:
    r"""$\Delta_{s,o}$ ({eq}`eq-ccq-sensitivity`) on each of several calibration sets.

    Returns ``(sensitivities, standard_errors)``, one dict per set: the mean over the set's
    windows of the paired per-window loss difference, and its standard error. Every
    configuration runs once over all sets together.
    """
    if not sets or any(len(w) < 2 for w in sets):
        raise ValueError("need at least one calibration set of at least two windows")
    sizes = [len(w) for w in sets]
    every = torch.cat([torch.as_tensor(w).long() for w in sets])
    bounds = np.cumsum([0] + sizes)
    base = reference_config(model.config.n_layers)
    reference = window_nll(model, every, base, world_size, min_context, source)
    sens = [{} for _ in sets]
    errors = [{} for _ in sets]
    for site in site_names(model.config.n_layers):
        for option in site_options(site)[1:]:
            diff = window_nll(model, every, dict(base, **{site: option}), world_size,
                              min_context, source) - reference
            for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
                part = diff[lo:hi]
                sens[i][site, option] = float(part.mean())
                errors[i][site, option] = float(part.std(ddof=1) / np.sqrt(part.size))
    return sens, errors


def floored(sensitivity: dict, standard_error: dict) -> dict:
    r"""Noise-floored costs $\tilde\Delta_{s,o} = \max(\Delta_{s,o}, 0) + \mathrm{se}_{s,o}$
    ({eq}`eq-ccq-floor`): no option looks free merely because its estimate came out low."""
    if set(sensitivity) != set(standard_error):
        raise ValueError("sensitivities and standard errors must have the same keys")
    if any(v < 0 for v in standard_error.values()):
        raise ValueError("standard errors must be non-negative")
    return {key: max(float(value), 0.0) + float(standard_error[key])
            for key, value in sensitivity.items()}


def equal_sensitivities(sensitivity: dict, rng: np.random.Generator | None = None,
                        jitter: float = 1e-3) -> dict:
    """The sensitivity-blind costs: each option's cost averaged over all sites of its kind.

    Every GEMM site then looks equally sensitive to, say, ``w4a4``, and every all-reduce equally
    sensitive to ``c4``; the ILP can still trade options against each other but not sites. With
    ``rng``, a relative jitter of at most ``jitter`` breaks the ties between sites at random. It
    must be large enough for the solver to see: a jitter below HiGHS's tolerances (about 1e-6 of
    the largest cost) leaves the tie to the solver's fixed search order, which is not random.
    """
    out = {}
    for kind in ("gemm", "comm"):
        keys = [key for key in sensitivity if site_kind(key[0]) == kind]
        for option in sorted({o for _, o in keys}):
            same = [key for key in keys if key[1] == option]
            mean = float(np.mean([sensitivity[key] for key in same]))
            for key in same:
                noise = 0.0 if rng is None else jitter * (abs(mean) + 1e-12) * rng.random()
                out[key] = mean + noise
    return out
