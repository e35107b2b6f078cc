r"""Sensitivity calibration and the measured loss of a precision configuration.

The calibration ({eq}`eq-ccq-sensitivity`) quantises one site at a time and records the change
of the mean next-token loss on a calibration split, relative to the reference configuration
(every GEMM unquantised, float16 communication):

$$\Delta_{s,o} = \mathrm{NLL}(\text{reference with site } s \text{ at } o) - \mathrm{NLL}
(\text{reference}).$$

The allocation then assumes these add up ({eq}`eq-ccq-additive`); :func:`additivity_ratio`
measures how well that holds on held-out data.
"""

from __future__ import annotations

import numpy as np
import torch

from icml26.cocoquant.tp import batch_nll, site_names, site_options, uniform_config
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
