r"""A synthetic language whose tokens live on a known circle, so that the tangent is known.

For 64 discrete symbols "tangent" has no meaning. Here symbol $v$ sits at angle
$\theta_v = 2\pi v / V$ and the text is a random walk on the circle: a Metropolis chain that
proposes a step of $\pm 1, \dots, \pm s_{\max}$ symbols and accepts it with probability
$\min(1, \pi_w / \pi_v)$, so its stationary distribution is the von Mises weight
$\pi_v \propto \exp(\beta \cos\theta_v)$ (``concentration`` $\beta$ sets the frequency bias).
The model's token embedding is frozen to the circle $e_v = r(\cos\theta_v\, u_1 + \sin\theta_v\,
u_2)$ in a random plane $(u_1, u_2)$, so at the embedding layer the tangent direction
$t_v = -\sin\theta_v\, u_1 + \cos\theta_v\, u_2$ and the in-plane normal
$n_v = \cos\theta_v\, u_1 + \sin\theta_v\, u_2$ of every position are known
(Eq. `eq-aniso-circle-share`).
"""

from __future__ import annotations

import numbers

import numpy as np
import torch

from icml26 import language
from icml26 import nn as tnn
from icml26.anisotropy.metrics import as_points


def _count(value, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def angles(vocab_size: int) -> np.ndarray:
    r"""The angles $\theta_v = 2\pi v / V$ of the symbols."""
    vocab_size = _count(vocab_size, "vocab_size", 3)
    return 2 * np.pi * np.arange(vocab_size) / vocab_size


def circle_source(vocab_size: int = 64, concentration: float = 0.0,
                  max_step: int = 2) -> language.MarkovSource:
    r"""Metropolis random walk on the circle with von Mises stationary law (module docstring)."""
    max_step = _count(max_step, "max_step", 1)
    if isinstance(concentration, bool) or not isinstance(concentration, numbers.Real) \
            or not np.isfinite(concentration) or concentration < 0:
        raise ValueError(f"concentration must be a finite number >= 0, got {concentration!r}")
    theta = angles(vocab_size)
    if 2 * max_step >= vocab_size:
        raise ValueError("max_step must be smaller than half the vocabulary")
    weight = np.exp(concentration * (np.cos(theta) - 1))
    stationary = weight / weight.sum()
    transition = np.zeros((vocab_size, vocab_size))
    steps = [s for s in range(-max_step, max_step + 1) if s != 0]
    for v in range(vocab_size):
        for s in steps:
            w = (v + s) % vocab_size
            transition[v, w] += min(1.0, weight[w] / weight[v]) / len(steps)
        transition[v, v] += 1 - transition[v].sum()
    return language.MarkovSource(vocab_size=vocab_size, order=1, transition=transition,
                                 stationary=stationary)


def circle_plane(d_model: int, seed: int = 0) -> np.ndarray:
    """A random orthonormal pair ``(d_model, 2)``: the plane of the circle."""
    d_model = _count(d_model, "d_model", 2)
    draws = np.random.default_rng(seed).standard_normal((d_model, 2))
    return np.linalg.qr(draws)[0]


def circle_embedding(vocab_size: int, plane: np.ndarray, radius: float = 1.0) -> np.ndarray:
    r"""Token vectors $e_v = r(\cos\theta_v u_1 + \sin\theta_v u_2)$, shape ``(V, d)``."""
    theta = angles(vocab_size)
    plane = np.asarray(plane, dtype=np.float64)
    if plane.ndim != 2 or plane.shape[1] != 2 or not np.allclose(plane.T @ plane, np.eye(2)):
        raise ValueError("plane must be a (d, 2) matrix with orthonormal columns")
    if not radius > 0:
        raise ValueError(f"radius must be positive, got {radius!r}")
    return radius * np.column_stack([np.cos(theta), np.sin(theta)]) @ plane.T


def tangent_and_normal(tokens, vocab_size: int, plane: np.ndarray) -> tuple[np.ndarray, ...]:
    r"""Unit tangent $t_v$ and in-plane normal $n_v$ at each token of ``tokens``,
    ``(N, d)`` each."""
    theta = angles(vocab_size)[np.asarray(tokens).reshape(-1)]
    plane = np.asarray(plane, dtype=np.float64)
    tangent = np.column_stack([-np.sin(theta), np.cos(theta)]) @ plane.T
    normal = np.column_stack([np.cos(theta), np.sin(theta)]) @ plane.T
    return tangent, normal


def direction_share(G, directions) -> float:
    r"""Share of gradient energy along one unit direction per row:
    $\sum_i (g_i^\top t_i)^2 / \sum_i \lVert g_i \rVert^2$ (Eq. `eq-aniso-circle-share`)."""
    G = as_points(G, "G")
    directions = np.asarray(directions, dtype=np.float64)
    if directions.shape != G.shape:
        raise ValueError(f"directions must have shape {G.shape}, got {directions.shape}")
    if not np.allclose(np.linalg.norm(directions, axis=1), 1.0, atol=1e-8):
        raise ValueError("directions must be unit vectors")
    return float(((G * directions).sum(axis=1) ** 2).sum() / (G**2).sum())


def subspace_capture(Q, directions) -> float:
    r"""Mean squared length of the unit ``directions`` inside span Q: $\frac1N\sum_i
    \lVert Q^\top t_i \rVert^2$ ($k/d$ for a uniformly random rank-$k$ subspace)."""
    Q = np.asarray(Q, dtype=np.float64)
    directions = np.asarray(directions, dtype=np.float64)
    if Q.ndim != 2 or directions.ndim != 2 or directions.shape[1] != Q.shape[0]:
        raise ValueError("Q must be (d, k) and directions (N, d)")
    return float(((directions @ Q) ** 2).sum(axis=1).mean())


def circle_model(config: tnn.GPTConfig, plane: np.ndarray, radius: float = 1.0,
                 seed: int = 0) -> tnn.TinyGPT:
    """A TinyGPT whose token embedding is frozen to :func:`circle_embedding`."""
    model = tnn.TinyGPT(config, seed=seed)
    table = circle_embedding(config.vocab_size, plane, radius)
    with torch.no_grad():
        model.tok_emb.weight.copy_(torch.as_tensor(table, dtype=model.tok_emb.weight.dtype))
    model.tok_emb.weight.requires_grad_(False)
    return model


def shuffled_source(source: language.MarkovSource, seed: int = 0) -> language.MarkovSource:
    r"""The same walk with its symbols relabelled by a random permutation $\sigma$:
    $P'_{\sigma(v)\sigma(w)} = P_{vw}$, $\pi'_{\sigma(v)} = \pi_v$.

    On the frozen circle embedding this is the falsification control of the tangent claim: the
    entropy rate and the stationary frequencies are unchanged, but consecutive symbols are no
    longer neighbours on the circle, so the dynamics no longer move along it.
    """
    if source.order != 1:
        raise ValueError("only order-1 sources can be relabelled")
    sigma = np.random.default_rng(seed).permutation(source.vocab_size)
    inverse = np.argsort(sigma)
    transition = np.asarray(source.transition)[np.ix_(inverse, inverse)]
    stationary = np.asarray(source.stationary)[inverse]
    return language.MarkovSource(vocab_size=source.vocab_size, order=1, transition=transition,
                                 stationary=stationary)
