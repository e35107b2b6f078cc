r"""The tangent-proxy test on a real decoder: SmolLM2-135M-Instruct through :mod:`icml26.llm`.

SmolLM2 is one of the decoder families the paper studies. Here only its one released
post-trained checkpoint is available, so the test is the paper's proxy-against-true-gradient
comparison at a single point of training:

* :func:`states_and_gradients`: the residual stream at chosen layers for a batch of texts, and,
  at the last layer (the input of the final norm), the exact gradient of each position's own
  next-token loss with respect to it, through the final RMSNorm and the (tied) LM head;
* :func:`head_basis`: the top-$k$ right singular subspace of $W_U \operatorname{diag}(\gamma)$,
  where the last layer's gradient would lie if only the head mattered (the head control);
* :func:`cross_fitted_shares`: energy shares (`eq-energy-share`) of a proxy fitted on all blocks
  of positions but one and scored on the held-out block, next to the head control's.

The first real position of every text is dropped: decoders of this family park a very large
activation there (an attention sink), which would dominate every statistic.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 (the usual torch alias)

from icml26 import llm
from icml26.anisotropy import tangent
from icml26.anisotropy.metrics import _check_rank, as_points


def states_and_gradients(lm: llm.LanguageModel, texts: Sequence[str],
                         layers: Sequence[int]) -> tuple[list[np.ndarray], np.ndarray,
                                                         np.ndarray]:
    r"""Residual stream at ``layers`` and the last layer's next-token gradients.

    Returns ``(states, G, block)``: ``states[i]`` is ``(N, d)``, the stream at ``layers[i]`` of
    the kept positions; ``G`` is ``(N, d)``, $\partial \ell_i / \partial h_i$ at the last layer
    (layer ``lm.n_layers``, where position $i$ affects only its own loss $\ell_i$); ``block`` is
    ``(N,)``, the index of the text each position comes from. Kept positions are the real tokens
    that have a next token, except the first of each text (the attention sink).
    """
    if isinstance(texts, str) or len(texts) < 1:
        raise ValueError("texts must be a non-empty list of strings")
    layers = list(layers)
    top = lm.n_layers
    batch = llm.encode(lm, list(texts))
    with torch.no_grad():
        stream = llm.hidden_states(lm, list(texts), sorted(set(layers) | {top}))
    order = sorted(set(layers) | {top})
    mask = batch["attention_mask"].bool()
    first = mask.int().argmax(dim=1)  # left padding: the first real token of each text
    keep = mask[:, :-1] & mask[:, 1:]
    keep[torch.arange(len(first)), first] = False
    targets = batch["input_ids"][:, 1:]
    h = stream[order.index(top)][:, :-1].detach().clone().requires_grad_(True)
    with torch.enable_grad():
        logits = lm.model.lm_head(lm.model.model.norm(h))
        loss = F.cross_entropy(logits[keep], targets[keep], reduction="sum")
        loss.backward()
    G = h.grad[keep].double().numpy()
    states = [stream[order.index(layer)][:, :-1][keep].double().numpy() for layer in layers]
    block = torch.arange(len(texts))[:, None].expand_as(keep)[keep].numpy()
    return states, G, block


def head_basis(lm: llm.LanguageModel, k: int) -> np.ndarray:
    r"""Top-$k$ right singular vectors of $W_U \operatorname{diag}(\gamma)$, ``(d, k)``: the head
    read through the final norm's gain $\gamma$ (the head control)."""
    k = _check_rank(k, lm.d_model)
    with torch.no_grad():
        weighted = llm.unembedding(lm) * lm.model.model.norm.weight
        gram = (weighted.T @ weighted).double().numpy()
    return np.linalg.eigh(gram)[1][:, ::-1][:, :k].copy()


def cross_fitted_shares(H, G, block, Q_head, k: int, n_folds: int = 4,
                        seed: int = 0) -> dict[str, np.ndarray]:
    r"""Per fold, the energy share of the semi-NMF proxy fitted on the other folds' activations
    and scored on this fold's gradients, and the head control's share on the same gradients.

    Folds group whole texts (``block`` labels), so a fold's positions never help fit the proxy
    that scores them. Returns arrays of length ``n_folds``: ``proxy``, ``head`` and ``k_over_d``.
    """
    H, G = as_points(H, "H"), as_points(G, "G")
    block = np.asarray(block)
    if H.shape != G.shape or block.shape != (len(H),):
        raise ValueError("H and G must have the same shape and block one label per row")
    if isinstance(n_folds, bool) or not isinstance(n_folds, numbers.Integral) or n_folds < 2:
        raise ValueError(f"n_folds must be an integer >= 2, got {n_folds!r}")
    texts = np.unique(block)
    if len(texts) < n_folds:
        raise ValueError(f"{len(texts)} texts cannot make {n_folds} folds")
    fold_of = dict(zip(texts, np.arange(len(texts)) % n_folds, strict=True))
    fold = np.array([fold_of[b] for b in block])
    proxy, head = [], []
    for f in range(n_folds):
        train, test = fold != f, fold == f
        Q = tangent.orthonormal_basis(tangent.semi_nmf(H[train], k, seed=seed)[1])
        proxy.append(tangent.energy_share(G[test], Q))
        head.append(tangent.energy_share(G[test], Q_head))
    return {"proxy": np.array(proxy), "head": np.array(head),
            "k_over_d": np.full(n_folds, k / H.shape[1])}
