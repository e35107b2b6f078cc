"""Hyperbolic residual quantisation for generative recommendation (HG-Rec style).

Chapter ``hyperbolic-rq`` of the book. The module has five parts.

* **Poincaré ball** of curvature ``-c`` (``c > 0``): :func:`mobius_add` {eq}`eq-hrq-mobius`,
  :func:`expmap0` and :func:`logmap0` {eq}`eq-hrq-exp-log`, :func:`dist` {eq}`eq-hrq-dist` and
  :func:`project`. Public functions reject points outside the ball and curvatures that are not
  positive; the chapter and the tests check them against ``geoopt.PoincareBall``.
* **Residual quantisation** in either geometry: :func:`residual_quantize` (Euclidean
  {eq}`eq-hrq-rq` or hyperbolic {eq}`eq-hrq-hrq`), :func:`reconstruct` {eq}`eq-hrq-recon`,
  :func:`collision_rate` and :func:`usage_perplexity`.
* **Tokenizers**: :func:`train_tokenizers` (``R`` independent RQ-VAEs stacked on a leading
  replicate axis and trained at once), :func:`train_tokenizers_clips` (the same at several clip
  radii in one stack, with the same initial weights per radius) and :func:`train_tokenizer`
  (one): MLP encoder and decoder
  with a clipped encoder output (the clip radius), codebooks in the tangent space at the origin
  mapped by ``expmap0``, straight-through estimator in the tangent space, any per-layer codebook
  sizes (uniform or :func:`pyramid`), the Möbius (HRQ) or tangent (HG-Rec) residual, and a
  weight on the codebook and commitment terms (``vq_weight``; 4 matches a Euclidean tokenizer to
  the ball's weight near the origin). :func:`dead_codes` counts unused codewords per layer;
  :func:`epochs_to_reach` reads a per-epoch history (collisions or reconstruction error).
* **Data**: :func:`make_catalogue` (items on a known three-level tree, sessions as walks on it).
* **Recommender**: :class:`SemanticIdRecommender` (a GRU over the semantic IDs of the history, a
  GRU-cell decoder over the next item's tokens), :func:`build_trie`, :func:`beam_search`
  (trie-constrained) and :func:`evaluate` (Recall@K and NDCG@K, leave-one-out).
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from .core import check_count, check_positive  # noqa: F401

# --- Poincaré ball ---------------------------------------------------------------------------

_EPS = {torch.float32: 4e-3, torch.float64: 1e-5}  # boundary margin, relative to 1/sqrt(c)
_MIN_NORM = 1e-15
GEOMETRIES = ("euclidean", "hyperbolic")


def check_curvature(c) -> float:
    """Return the ball's ``c`` (curvature ``-c``) as a float; ``c`` must be a positive real."""
    if isinstance(c, bool) or not isinstance(c, numbers.Real):
        raise TypeError(f"c must be a positive real number, got {type(c).__name__}")
    c = float(c)
    if not c > 0 or not np.isfinite(c):
        raise ValueError(f"the Poincaré ball needs c > 0 (curvature -c < 0), got c = {c}")
    return c


def _tensor(x, name: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _EPS:
        raise TypeError(f"{name} must be float32 or float64, got {x.dtype}")
    if x.ndim < 1 or x.shape[-1] < 1:
        raise ValueError(f"{name} must have points along its last axis, got {tuple(x.shape)}")
    if not bool(torch.isfinite(x.detach()).all()):
        raise ValueError(f"{name} contains NaN or infinite values")
    return x


def check_in_ball(x, c: float = 1.0, name: str = "x") -> Tensor:
    """Return ``x`` if every row lies strictly inside the ball ``c ||x||^2 < 1``."""
    c = check_curvature(c)
    x = _tensor(x, name)
    sq = float((c * x.detach().pow(2).sum(-1)).max()) if x.numel() else 0.0
    if sq >= 1.0:
        raise ValueError(f"{name} has a point outside the Poincaré ball: c ||x||^2 = {sq:.6g} >= 1")
    return x


def _mobius_add(x: Tensor, y: Tensor, c: float) -> Tensor:
    xy = (x * y).sum(-1, keepdim=True)
    x2 = x.pow(2).sum(-1, keepdim=True)
    y2 = y.pow(2).sum(-1, keepdim=True)
    num = (1 + 2 * c * xy + c * y2) * x + (1 - c * x2) * y
    den = 1 + 2 * c * xy + c**2 * x2 * y2
    return num / den.clamp_min(_MIN_NORM)


def _project(x: Tensor, c: float) -> Tensor:
    norm = x.norm(dim=-1, keepdim=True).clamp_min(_MIN_NORM)
    max_norm = (1 - _EPS[x.dtype]) / c**0.5
    return torch.where(norm > max_norm, x / norm * max_norm, x)


def _expmap0(v: Tensor, c: float) -> Tensor:
    sc = c**0.5
    norm = v.norm(dim=-1, keepdim=True).clamp_min(_MIN_NORM)
    return _project(torch.tanh(sc * norm) * v / (sc * norm), c)


def _artanh(x: Tensor) -> Tensor:
    x = x.clamp(-1 + 1e-15, 1 - 1e-15)
    return 0.5 * (torch.log1p(x) - torch.log1p(-x))


def _logmap0(y: Tensor, c: float) -> Tensor:
    sc = c**0.5
    norm = y.norm(dim=-1, keepdim=True).clamp_min(_MIN_NORM)
    return _artanh(sc * norm) * y / (sc * norm)


def _dist(x: Tensor, y: Tensor, c: float) -> Tensor:
    sc = c**0.5
    return 2 / sc * _artanh(sc * _mobius_add(-x, y, c).norm(dim=-1))


def mobius_add(x, y, c: float = 1.0) -> Tensor:
    """Möbius addition ``x ⊕_c y`` {eq}`eq-hrq-mobius` (broadcasts over leading axes)."""
    c = check_curvature(c)
    return _mobius_add(check_in_ball(x, c, "x"), check_in_ball(y, c, "y"), c)


def expmap0(v, c: float = 1.0) -> Tensor:
    """Exponential map at the origin {eq}`eq-hrq-exp-log`, projected just inside the ball."""
    c = check_curvature(c)
    return _expmap0(_tensor(v, "v"), c)


def logmap0(y, c: float = 1.0) -> Tensor:
    """Logarithm map at the origin {eq}`eq-hrq-exp-log`, the inverse of :func:`expmap0`."""
    c = check_curvature(c)
    return _logmap0(check_in_ball(y, c, "y"), c)


def dist(x, y, c: float = 1.0) -> Tensor:
    """Geodesic distance on the ball {eq}`eq-hrq-dist`."""
    c = check_curvature(c)
    return _dist(check_in_ball(x, c, "x"), check_in_ball(y, c, "y"), c)


def project(x, c: float = 1.0) -> Tensor:
    """Pull points farther than ``(1 - eps)/sqrt(c)`` from the origin back onto that sphere."""
    c = check_curvature(c)
    return _project(_tensor(x, "x"), c)


# --- Residual quantisation -------------------------------------------------------------------


def _check_geometry(geometry: str) -> str:
    if geometry not in GEOMETRIES:
        raise ValueError(f"geometry must be one of {GEOMETRIES}, got {geometry!r}")
    return geometry


def _check_codebooks(codebooks) -> list[Tensor]:
    if not isinstance(codebooks, (list, tuple)) or len(codebooks) == 0:
        raise ValueError("codebooks must be a non-empty list of (K_l, d) tensors")
    out = []
    for level, book in enumerate(codebooks):
        _tensor(book, f"codebooks[{level}]")
        if book.ndim != 2 or book.shape[0] == 0:
            raise ValueError(f"codebooks[{level}] must be a non-empty (K, d) matrix, "
                             f"got shape {tuple(book.shape)}")
        out.append(book)
    return out


RESIDUALS = ("mobius", "tangent")


def _check_residual(residual: str) -> str:
    if residual not in RESIDUALS:
        raise ValueError(f"residual must be one of {RESIDUALS}, got {residual!r}")
    return residual


def _sub(r: Tensor, q: Tensor, geometry: str, c: float, residual: str = "mobius") -> Tensor:
    if geometry == "euclidean":
        return r - q
    if residual == "tangent":
        return _expmap0(_logmap0(r, c) - _logmap0(q, c), c)
    return _mobius_add(-q, r, c)


def _add(q: Tensor, r: Tensor, geometry: str, c: float, residual: str = "mobius") -> Tensor:
    if geometry == "euclidean":
        return q + r
    if residual == "tangent":
        return _expmap0(_logmap0(q, c) + _logmap0(r, c), c)
    return _mobius_add(q, r, c)


def _pairwise(r: Tensor, book: Tensor, geometry: str, c: float) -> Tensor:
    """Distances of the rows of ``r`` (..., n, d) to the codewords ``book`` (..., K, d)."""
    if geometry == "euclidean":
        return torch.cdist(r, book)
    return _dist(r[..., :, None, :], book[..., None, :, :], c)


def _nearest(r: Tensor, book: Tensor, geometry: str, c: float) -> Tensor:
    """Index of the nearest codeword. In the ball ``cosh(sqrt(c) d_c(x, y)) - 1`` equals
    ``2c||x - y||^2 / ((1 - c||x||^2)(1 - c||y||^2))``, so the argmin over ``y`` of ``d_c`` is the
    argmin of ``||x - y||^2 / (1 - c||y||^2)``: no Möbius addition. With ``w = 1/(1 - c||y||^2)``
    (``1`` in Euclidean space) the score ``w||x||^2 + w||y||^2 - 2w x.y`` is one matrix product of
    ``[x, ||x||^2, 1]`` with ``[-2wy, w, w||y||^2]``; in Euclidean space the ``||x||^2`` column is
    left out, since it is the same for every codeword."""
    b2 = book.pow(2).sum(-1, keepdim=True)
    ones = torch.ones_like(r[..., :1])
    if geometry == "hyperbolic":
        w = 1 / (1 - c * b2).clamp_min(_MIN_NORM)
        left = torch.cat([r, r.pow(2).sum(-1, keepdim=True), ones], -1)
        right = torch.cat([-2 * w * book, w, w * b2], -1)
    else:
        left = torch.cat([r, ones], -1)
        right = torch.cat([-2 * book, b2], -1)
    return (left @ right.transpose(-1, -2)).argmin(dim=-1)


def _take(book: Tensor, k: Tensor) -> Tensor:
    """Codewords ``book[..., k, :]`` for code indices ``k`` (..., n)."""
    if book.ndim == 2:
        return book[k]
    return torch.gather(book, -2, k[..., None].expand(*k.shape, book.shape[-1]))


def _quantize(z: Tensor, codebooks: list[Tensor], geometry: str, c: float,
              residual: str = "mobius"):
    """Nearest codeword per layer, then the residual: Möbius (HRQ) or tangent (HG-Rec)."""
    r, codes, residuals = z, [], [z]
    tangent = residual == "tangent" and geometry == "hyperbolic"
    t = _logmap0(z, c) if tangent else None
    for book in codebooks:
        k = _nearest(r.detach(), book.detach(), geometry, c)
        q = _take(book, k)
        if tangent:  # r_{l+1} = exp0(log0 r_l - log0 c_k): a plain subtraction in T_0
            t = t - _logmap0(q, c)
            r = _expmap0(t, c)
        else:
            r = _sub(r, q, geometry, c)
        codes.append(k)
        residuals.append(r)
    return torch.stack(codes, dim=-1), residuals


def residual_quantize(z, codebooks, geometry: str = "hyperbolic", c: float = 1.0,
                      residual: str = "mobius"):
    """Quantise rows of ``z`` layer by layer; return ``(codes, residuals)``.

    Euclidean {eq}`eq-hrq-rq`: ``k_l = argmin ||r_l - e_{l,k}||`` and
    ``r_{l+1} = r_l - e_{l,k_l}``. Hyperbolic {eq}`eq-hrq-hrq`: ``k_l = argmin d_c(r_l, e_{l,k})``
    and, with ``residual="mobius"`` (HRQ), ``r_{l+1} = (-e_{l,k_l}) ⊕_c r_l``; with
    ``residual="tangent"`` (HG-Rec) ``r_{l+1} = exp0(log0 r_l - log0 e_{l,k_l})``
    {eq}`eq-hrq-tangent`. ``codes`` is ``(n, L)``; ``residuals`` lists ``r_1 .. r_{L+1}``.
    """
    geometry = _check_geometry(geometry)
    residual = _check_residual(residual)
    codebooks = _check_codebooks(codebooks)
    c = check_curvature(c)
    z = check_in_ball(z, c, "z") if geometry == "hyperbolic" else _tensor(z, "z")
    if z.ndim != 2:
        raise ValueError(f"z must be an (n, d) matrix, got shape {tuple(z.shape)}")
    for level, book in enumerate(codebooks):
        if book.shape[1] != z.shape[1]:
            raise ValueError(f"codebooks[{level}] has dimension {book.shape[1]}, "
                             f"z has {z.shape[1]}")
        if geometry == "hyperbolic":
            check_in_ball(book, c, f"codebooks[{level}]")
    return _quantize(z, codebooks, geometry, c, residual)


def reconstruct(codebooks, codes, geometry: str = "hyperbolic", c: float = 1.0, tail=None,
                residual: str = "mobius"):
    """Rebuild ``e_{1,k_1} ⊕ (e_{2,k_2} ⊕ (... ⊕ (e_{L,k_L} ⊕ tail)))`` {eq}`eq-hrq-recon`.

    The nesting is innermost-last because Möbius addition is neither commutative nor associative;
    with ``tail`` the last residual ``r_{L+1}`` the reconstruction is exact. With
    ``residual="tangent"`` the codewords add in the tangent space at the origin, in any order.
    """
    geometry = _check_geometry(geometry)
    residual = _check_residual(residual)
    codebooks = _check_codebooks(codebooks)
    c = check_curvature(c)
    if not isinstance(codes, Tensor) or codes.ndim != 2 or codes.shape[1] != len(codebooks):
        raise ValueError(f"codes must be an (n, {len(codebooks)}) integer tensor")
    return _reconstruct(codebooks, codes, geometry, c, tail, residual)


def _reconstruct(codebooks, codes, geometry, c, tail=None, residual="mobius"):
    if geometry == "hyperbolic" and residual == "tangent":
        t = sum(_logmap0(_take(b, codes[..., lev]), c) for lev, b in enumerate(codebooks))
        if tail is not None:
            t = t + _logmap0(tail, c)
        return _expmap0(t, c)
    first = _take(codebooks[0], codes[..., 0])
    out = tail if tail is not None else torch.zeros_like(first)
    for level in range(len(codebooks) - 1, -1, -1):
        out = _add(_take(codebooks[level], codes[..., level]), out, geometry, c)
    return out


def collision_rate(codes) -> float:
    """``1 - (number of distinct code tuples) / (number of items)``, before de-duplication."""
    codes = np.asarray(codes)
    if codes.ndim != 2 or codes.shape[0] == 0:
        raise ValueError("codes must be a non-empty (n, L) array")
    return 1.0 - len(np.unique(codes, axis=0)) / codes.shape[0]


def usage_perplexity(codes, sizes) -> np.ndarray:
    """Per-layer ``exp(entropy of code usage) / K_l``: 1 when every code is used equally often."""
    codes = np.asarray(codes)
    sizes = check_sizes(sizes)
    if codes.ndim != 2 or codes.shape[1] != len(sizes):
        raise ValueError(f"codes must be an (n, {len(sizes)}) array")
    out = []
    for level, k in enumerate(sizes):
        p = np.bincount(codes[:, level], minlength=k) / codes.shape[0]
        p = p[p > 0]
        out.append(np.exp(-(p * np.log(p)).sum()) / k)
    return np.array(out)


def dead_codes(codes, sizes) -> np.ndarray:
    """Per-layer number of codewords that no item uses."""
    codes = np.asarray(codes)
    sizes = check_sizes(sizes)
    if codes.ndim != 2 or codes.shape[1] != len(sizes):
        raise ValueError(f"codes must be an (n, {len(sizes)}) array")
    return np.array([k - len(np.unique(codes[:, lev])) for lev, k in enumerate(sizes)])


def check_sizes(sizes) -> tuple[int, ...]:
    """Codebook sizes per layer: a non-empty sequence of positive integers."""
    if not isinstance(sizes, (list, tuple)) or len(sizes) == 0:
        raise ValueError("sizes must be a non-empty list of codebook sizes")
    return tuple(check_count(k, "codebook size", minimum=1) for k in sizes)


def pyramid(k1: int, gamma: float, layers: int) -> tuple[int, ...]:
    """Differential-length codebook sizes ``K_l = round(K_1 gamma^(l-1))``, ``l = 1..L``."""
    check_count(k1, "k1", minimum=1)
    check_count(layers, "layers", minimum=1)
    if not gamma > 0:
        raise ValueError(f"gamma must be positive, got {gamma}")
    return tuple(max(1, round(k1 * gamma**lev)) for lev in range(layers))


# --- Tokenizers (RQ-VAE) ---------------------------------------------------------------------


def _lift(t: Tensor, geometry: str, c: float) -> Tensor:
    return t if geometry == "euclidean" else _expmap0(t, c)


def _lower(z: Tensor, geometry: str, c: float) -> Tensor:
    return z if geometry == "euclidean" else _logmap0(z, c)


def _kmeans(points: Tensor, k: int, geometry: str, c: float, gen: torch.Generator,
            iters: int = 10, groups: int = 1) -> Tensor:
    """Lloyd's k-means in the given geometry, batched over leading axes of ``points`` (..., n, d).

    Assignments use the geometry's distance; centroids are averaged in the tangent space at 0.
    With ``groups > 1`` the leading axis holds ``groups`` copies of one stack, and every copy
    starts from the same random points.
    """
    batch, (n, d) = points.shape[:-2], points.shape[-2:]
    flat = points.reshape(-1, n, d)
    b = flat.shape[0]
    idx = torch.stack([torch.randperm(n, generator=gen)[:k] if n >= k
                       else torch.randint(n, (k,), generator=gen) for _ in range(b // groups)])
    idx = idx.repeat(groups, 1)
    centres = torch.gather(flat, 1, idx[..., None].expand(b, k, d)).clone()
    tangent = _lower(flat, geometry, c)
    for _ in range(iters):
        assign = _nearest(flat, centres, geometry, c)
        sums = torch.zeros(b, k, d, dtype=flat.dtype).scatter_add_(
            1, assign[..., None].expand(b, n, d), tangent)
        counts = torch.zeros(b, k, dtype=flat.dtype).scatter_add_(
            1, assign, torch.ones(b, n, dtype=flat.dtype))
        mean = _lift(sums / counts.clamp_min(1)[..., None], geometry, c)
        centres = torch.where(counts[..., None] > 0, mean, centres)
    return centres.reshape(*batch, k, d)


def fit_codebooks(z, sizes, geometry: str = "hyperbolic", c: float = 1.0, seed: int = 0,
                  iters: int = 10, residual: str = "mobius") -> list[Tensor]:
    """Residual k-means without an encoder: layer ``l`` clusters the residuals ``r_l``.

    This is the codebook initialisation of :func:`train_tokenizer`, usable on its own as a
    training-free tokenizer of fixed latents ``z``.
    """
    geometry = _check_geometry(geometry)
    residual = _check_residual(residual)
    sizes = check_sizes(sizes)
    c = check_curvature(c)
    z = check_in_ball(z, c, "z") if geometry == "hyperbolic" else _tensor(z, "z")
    gen = torch.Generator().manual_seed(seed)
    r, books = z.detach(), []
    for k in sizes:
        centres = _kmeans(r, k, geometry, c, gen, iters)
        codes = _nearest(r, centres, geometry, c)
        r = _sub(r, _take(centres, codes), geometry, c, residual)
        books.append(centres)
    return books


@dataclass
class Tokenizer:
    """A trained RQ-VAE: its semantic IDs and what it cost."""

    geometry: str
    sizes: tuple[int, ...]
    codes: np.ndarray
    codebooks: list[Tensor]
    latent: Tensor
    seconds: float
    losses: list[float]
    residual: str = "mobius"
    agreement: float = float("nan")
    collisions: np.ndarray | None = None
    reconstruction: np.ndarray | None = None

    @property
    def collision(self) -> float:
        return collision_rate(self.codes)

    @property
    def perplexity(self) -> np.ndarray:
        return usage_perplexity(self.codes, self.sizes)

    @property
    def dead(self) -> np.ndarray:
        return dead_codes(self.codes, self.sizes)


def _linear(fan_in: int, fan_out: int, reps: int, gen: torch.Generator):
    bound = 1.0 / fan_in**0.5
    w = (torch.rand(reps, fan_in, fan_out, generator=gen) * 2 - 1) * bound
    b = (torch.rand(reps, 1, fan_out, generator=gen) * 2 - 1) * bound
    return nn.Parameter(w), nn.Parameter(b)


class _StackedRQVAE(nn.Module):
    """``R`` independent RQ-VAEs trained together: every weight has a leading replicate axis."""

    def __init__(self, reps: int, d_in: int, hidden: int, latent: int, sizes, geometry: str,
                 c: float, clip: float, residual: str, gen: torch.Generator):
        super().__init__()
        self.geometry, self.c, self.clip, self.residual = geometry, c, clip, residual
        self.params = nn.ParameterList()
        for fan_in, fan_out in ((d_in, hidden), (hidden, latent), (latent, hidden),
                                (hidden, d_in)):
            self.params.extend(_linear(fan_in, fan_out, reps, gen))
        # codebooks are stored in the tangent space at the origin (Euclidean: the codewords)
        self.books = nn.ParameterList([nn.Parameter(torch.zeros(reps, k, latent))
                                       for k in sizes])

    def _mlp(self, x: Tensor, first: int) -> Tensor:
        w1, b1, w2, b2 = self.params[first:first + 4]
        return torch.baddbmm(b2, torch.relu(torch.baddbmm(b1, x, w1)), w2)

    def codewords(self) -> list[Tensor]:
        return [_lift(b, self.geometry, self.c) for b in self.books]

    def encode_tangent(self, x: Tensor) -> Tensor:
        """The encoder's output in the tangent space at the origin, after the clip."""
        t = self._mlp(x, 0)
        if self.clip is not None:  # feature clipping: (tangent) norm at most clip/sqrt(c)
            norm = t.norm(dim=-1, keepdim=True).clamp_min(_MIN_NORM)
            if isinstance(self.clip, Tensor):  # one radius per model, inf for unclipped ones
                unclipped = torch.isinf(self.clip)
                radius = torch.where(unclipped, 1.0, self.clip)
                scale = torch.where(unclipped, 1.0, (radius / self.c**0.5 / norm).clamp(max=1.0))
            else:
                scale = (self.clip / self.c**0.5 / norm).clamp(max=1.0)
            t = t * scale
        return t

    def encode(self, x: Tensor) -> Tensor:
        return _lift(self.encode_tangent(x), self.geometry, self.c)

    def decode(self, t: Tensor) -> Tensor:
        return self._mlp(t, 4)

    def _vq(self, r: Tensor, q: Tensor, beta: float) -> Tensor:
        """Codebook term ``d(sg r, q)^2`` plus ``beta`` times the commitment term
        ``d(r, sg q)^2``, summed over replicates. In the ball both come from one distance: its
        value is used once, the gradient reaching ``r`` is scaled by ``beta`` (same gradients
        as two separate terms, one Möbius addition instead of two)."""
        if self.geometry == "euclidean":
            d_book = (r.detach() - q).pow(2).sum(-1)
            d_commit = (r - q.detach()).pow(2).sum(-1)
            return d_book.mean(-1).sum() + beta * d_commit.mean(-1).sum()
        r_scaled = r.detach() + beta * (r - r.detach())  # value r, gradient times beta
        d2 = _dist(r_scaled, q, self.c).pow(2).mean(-1).sum()
        return d2 + beta * d2.detach()

    def forward(self, x: Tensor, beta: float, vq_weight: float = 1.0):
        t = self.encode_tangent(x)
        vq = x.new_zeros(())
        if self.geometry == "hyperbolic" and self.residual == "tangent":
            # everything in the tangent space at 0: r_l = exp0(t_l), t_{l+1} = t_l - b_{l,k_l}
            # (the codebooks are stored as tangent vectors, so no log0 of exp0 round trips)
            tl, tq, codes = t, 0, []
            for tangent_book in self.books:
                book = _expmap0(tangent_book, self.c)
                r = _expmap0(tl, self.c)
                k = _nearest(r.detach(), book.detach(), self.geometry, self.c)
                vq = vq + self._vq(r, _take(book, k), beta)
                b = _take(tangent_book, k)
                tl, tq = tl - b, tq + b
                codes.append(k)
            codes = torch.stack(codes, dim=-1)
        else:
            z = _lift(t, self.geometry, self.c)
            books = self.codewords()
            codes, residuals = _quantize(z, books, self.geometry, self.c, self.residual)
            for level, book in enumerate(books):
                vq = vq + self._vq(residuals[level], _take(book, codes[..., level]), beta)
            zq = _reconstruct(books, codes, self.geometry, self.c, None, self.residual)
            tq = _lower(zq, self.geometry, self.c)
        t_st = t + (tq - t).detach()  # straight-through in the tangent space at the origin
        recon = (self.decode(t_st) - x).pow(2).sum(-1).mean(-1)
        return recon.sum() + vq_weight * vq, codes, recon.detach()


def _argmin_agreement(z: Tensor, books: list[Tensor], c: float, residual: str) -> Tensor:
    """Per replicate: share of (item, layer) choices where the hyperbolic nearest codeword is
    also the nearest in Euclidean distance of the tangent vectors (the same residual path)."""
    codes, residuals = _quantize(z, books, "hyperbolic", c, residual)
    agree = []
    for level, book in enumerate(books):
        t = _logmap0(residuals[level], c)
        k_e = torch.cdist(t, _logmap0(book, c)).argmin(-1)
        agree.append((k_e == codes[..., level]).float().mean(-1))
    return torch.stack(agree, -1).mean(-1)


def train_tokenizers(x, sizes, geometry: str = "hyperbolic", *, clip: float | None = 1.0,
                     **kw) -> list[Tokenizer]:
    """Train one RQ-VAE per catalogue of ``x`` (R, n, d), all at once; return their IDs.

    The ``R`` models are independent (own weights, codebooks, k-means initialisation); stacking
    them only batches the arithmetic. ``warmup`` epochs train the autoencoders alone; then each
    codebook is initialised by k-means on that layer's residuals (or, with
    ``kmeans_init=False``, by small random tangent vectors) and everything trains jointly with
    the codebook and commitment terms measured in the tokenizer's own distance.
    ``clip`` bounds the encoder's (tangent) output norm by ``clip/sqrt(c)``, so the latents stay
    within hyperbolic radius ``2 clip/sqrt(c)`` of the origin: it sets how hyperbolic the used part
    of the ball is. ``None`` (Euclidean only) leaves the encoder unclipped, as in TIGER.
    ``Tokenizer.seconds`` is the wall time of the whole batch divided by ``R``.
    """
    return train_tokenizers_clips(x, sizes, geometry, clips=(clip,), **kw)[clip]


def train_tokenizers_clips(x, sizes, geometry: str = "hyperbolic", *, clips=(1.0,),
                           residual: str = "mobius", c: float = 1.0, latent: int = 8,
                           hidden: int = 64, epochs: int = 150, warmup: int = 30,
                           lr: float = 3e-3, beta: float = 0.25, kmeans_init: bool = True,
                           vq_weight: float = 1.0, track_collisions: bool = False,
                           seed: int = 0) -> dict:
    """:func:`train_tokenizers` at several clip radii at once: ``{clip: list of R Tokenizers}``.

    Each radius gets the same initial weights and k-means starting points for catalogue ``r``
    as a separate call with the same ``seed`` would (common random numbers across radii); the
    ``len(clips) * R`` models are independent and only share the arithmetic of one stacked model.
    ``Tokenizer.seconds`` is then the wall time divided by ``len(clips) * R``.
    """
    geometry = _check_geometry(geometry)
    residual = _check_residual(residual)
    sizes = check_sizes(sizes)
    c = check_curvature(c)
    x = _tensor(torch.as_tensor(np.asarray(x), dtype=torch.float32), "x")
    if x.ndim != 3 or x.shape[1] < 2:
        raise ValueError("x must be an (R, n, d) stack of catalogues with n >= 2")
    check_count(epochs, "epochs", minimum=1)
    check_count(warmup, "warmup", minimum=0)
    check_positive(vq_weight, "vq_weight")
    clips = tuple(clips)
    if not clips or len(set(clips)) != len(clips):
        raise ValueError("clips must be a non-empty sequence of distinct radii")
    for clip in clips:
        if clip is not None:
            check_positive(clip, "clip")
        elif geometry == "hyperbolic":
            raise ValueError("a hyperbolic tokenizer needs a clip radius (latents stay in the "
                             "ball)")
    base, groups = x.shape[0], len(clips)
    reps = base * groups
    gen = torch.Generator().manual_seed(seed)
    if clips == (None,):
        clip_t = None
    else:  # one radius per stacked model; None (unclipped) as an infinite radius
        clip_t = torch.tensor([math.inf if r is None else float(r) for r in clips])
        clip_t = clip_t.repeat_interleave(base)[:, None, None]
    model = _StackedRQVAE(base, x.shape[2], hidden, latent, sizes, geometry, c, clip_t,
                          residual, gen)
    if groups > 1:  # the same initial weights for every radius
        with torch.no_grad():
            for p in model.parameters():
                p.data = p.data.repeat(groups, 1, 1)
        x = x.repeat(groups, 1, 1)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses, history, recons = [], [], []
    start = time.perf_counter()
    for _ in range(warmup):
        loss = (model.decode(model.encode_tangent(x)) - x).pow(2).sum(-1).mean(-1).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        r = model.encode(x)
        for level, k in enumerate(sizes):
            if kmeans_init:
                centres = _kmeans(r, k, geometry, c, gen, groups=groups)
            else:
                start_t = 0.01 * torch.randn(base, k, latent, generator=gen)
                centres = _lift(start_t.repeat(groups, 1, 1), geometry, c)
            model.books[level].copy_(_lower(centres, geometry, c))
            codes = _nearest(r, centres, geometry, c)
            r = _sub(r, _take(centres, codes), geometry, c, residual)
    for _ in range(epochs):
        loss, codes, recon = model(x, beta, vq_weight)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()) / reps)
        if track_collisions:
            history.append(_collision_rates(codes, sizes))
            recons.append(recon.numpy())
    seconds = (time.perf_counter() - start) / reps
    with torch.no_grad():
        z = model.encode(x)
        books = [b.detach() for b in model.codewords()]
        codes, _ = _quantize(z, books, geometry, c, residual)
        agree = (_argmin_agreement(z, books, c, residual) if geometry == "hyperbolic"
                 else torch.full((reps,), float("nan")))
    history = np.array(history).T if track_collisions else np.zeros((reps, 0))
    recons = np.array(recons).T if track_collisions else np.zeros((reps, 0))
    out = [Tokenizer(geometry, sizes, codes[i].numpy(), [b[i] for b in books], z[i],
                     seconds, losses, residual, float(agree[i]), history[i], recons[i])
           for i in range(reps)]
    return {clip: out[g * base:(g + 1) * base] for g, clip in enumerate(clips)}


def _collision_rates(codes: Tensor, sizes) -> np.ndarray:
    """Collision rate of each replicate's codes (R, n, L), one integer key per tuple."""
    key = np.zeros(codes.shape[:2], dtype=np.int64)
    for level, k in enumerate(sizes):
        key = key * k + codes[..., level].numpy()
    key.sort(axis=1)
    distinct = 1 + (np.diff(key, axis=1) != 0).sum(1)
    return 1.0 - distinct / codes.shape[1]


def epochs_to_reach(values, target: float) -> float:
    """First epoch (1-based) whose value (a per-epoch history such as ``Tokenizer.collisions`` or
    ``Tokenizer.reconstruction``) is at most ``target``; ``inf`` if none is."""
    values = np.asarray(values, dtype=float)
    if values.ndim != 1 or values.size == 0:
        raise ValueError("values must be a non-empty 1-D history (track_collisions=True)")
    hit = np.flatnonzero(values <= target)
    return float(hit[0] + 1) if hit.size else float("inf")


def train_tokenizer(x, sizes, geometry: str = "hyperbolic", **kw) -> Tokenizer:
    """Train one RQ-VAE tokenizer on item embeddings ``x`` (n, d); see :func:`train_tokenizers`."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError("x must be an (n, d) matrix with n >= 2")
    return train_tokenizers(x[None], sizes, geometry, **kw)[0]


# --- Data ------------------------------------------------------------------------------------


@dataclass
class Catalogue:
    """Items with content embeddings, their tree path, and user sessions (lists of item ids)."""

    features: np.ndarray
    sessions: list[np.ndarray]
    paths: np.ndarray | None = None

    @property
    def n_items(self) -> int:
        return self.features.shape[0]


def make_catalogue(branching=(6, 4, 4), items_per_leaf: int = 8, dim: int = 32,
                   scales=(1.0, 0.5, 0.25, 0.12), n_users: int = 500, length=(8, 14),
                   moves=(0.55, 0.25, 0.12, 0.08), seed: int = 0) -> Catalogue:
    """A catalogue on a known three-level tree, and sessions that walk on it.

    Item ``i`` under path ``(a, b, l)`` has embedding ``tanh(W (m_a + m_ab + m_abl + s_4 g_i))``
    with Gaussian offsets of scales ``scales`` per level and a fixed random ``W`` (so that no
    geometry is favoured by construction). A session moves to an item of the same leaf, the same
    sub-category, the same category or anywhere with probabilities ``moves``.
    """
    if len(branching) != 3 or len(scales) != 4:
        raise ValueError("branching needs three levels and scales four (three levels and the item)")
    b = [check_count(v, "branching", minimum=1) for v in branching]
    per = check_count(items_per_leaf, "items_per_leaf", minimum=1)
    moves = np.asarray(moves, dtype=float)
    if moves.shape != (4,) or (moves < 0).any() or abs(moves.sum() - 1) > 1e-9:
        raise ValueError("moves must be four probabilities summing to 1")
    rng = np.random.default_rng(seed)
    paths = np.array([(i, j, k) for i in range(b[0]) for j in range(b[1]) for k in range(b[2])
                      for _ in range(per)])
    n = len(paths)
    m1 = rng.normal(size=(b[0], dim)) * scales[0]
    m2 = rng.normal(size=(b[0], b[1], dim)) * scales[1]
    m3 = rng.normal(size=(b[0], b[1], b[2], dim)) * scales[2]
    a, b_, leaf_ = paths[:, 0], paths[:, 1], paths[:, 2]
    raw = m1[a] + m2[a, b_] + m3[a, b_, leaf_] + rng.normal(size=(n, dim)) * scales[3]
    w = rng.normal(size=(dim, dim)) / np.sqrt(dim)
    features = np.tanh(raw @ w * 1.5)
    leaf = paths[:, 0] * b[1] * b[2] + paths[:, 1] * b[2] + paths[:, 2]
    groups = [leaf, paths[:, 0] * b[1] + paths[:, 1], paths[:, 0]]
    members = [{g: np.flatnonzero(key == g) for g in np.unique(key)} for key in groups]
    sessions = []
    lo, hi = length
    for _ in range(check_count(n_users, "n_users", minimum=1)):
        item = int(rng.integers(n))
        seq = [item]
        for _ in range(int(rng.integers(lo, hi + 1)) - 1):
            move = rng.choice(4, p=moves)
            pool = np.arange(n) if move == 3 else members[move][groups[move][item]]
            item = int(rng.choice(pool))
            seq.append(item)
        sessions.append(np.array(seq))
    return Catalogue(features.astype(np.float32), sessions, paths)


# --- Recommender over semantic IDs -----------------------------------------------------------


def dedup_tokens(codes) -> np.ndarray:
    """Append a suffix token 0, 1, 2, ... to items that share a code tuple (unique IDs)."""
    codes = np.asarray(codes)
    if codes.ndim != 2 or codes.shape[0] == 0:
        raise ValueError("codes must be a non-empty (n, L) array")
    _, inverse = np.unique(codes, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    suffix = np.zeros(len(codes), dtype=np.int64)
    seen: dict[int, int] = {}
    for i, g in enumerate(inverse):
        suffix[i] = seen.get(g, 0)
        seen[g] = suffix[i] + 1
    return np.concatenate([codes, suffix[:, None]], axis=1).astype(np.int64)


@dataclass
class Trie:
    """Prefix tree of the items' token tuples, as per-level child tables (-1: no child)."""

    children: list[Tensor]
    leaf_to_item: Tensor
    vocab: tuple[int, ...]


def build_trie(tokens) -> Trie:
    """Trie over unique token tuples (n, L'); ``children[l][node, token]`` is the child node."""
    tokens = np.asarray(tokens)
    if len(np.unique(tokens, axis=0)) != len(tokens):
        raise ValueError("token tuples must be unique (de-duplicate them first)")
    n, depth = tokens.shape
    vocab = tuple(int(tokens[:, lev].max()) + 1 for lev in range(depth))
    node = np.zeros(n, dtype=np.int64)
    children = []
    for lev in range(depth):
        _, child = np.unique(tokens[:, :lev + 1], axis=0, return_inverse=True)
        child = child.ravel()
        table = np.full((node.max() + 1, vocab[lev]), -1, dtype=np.int64)
        table[node, tokens[:, lev]] = child
        children.append(torch.from_numpy(table))
        node = child
    leaf_to_item = np.empty(n, dtype=np.int64)
    leaf_to_item[node] = np.arange(n)
    return Trie(children, torch.from_numpy(leaf_to_item), vocab)


def make_examples(sessions, n_items: int, history: int = 8):
    """Leave-one-out examples: training pairs from every prefix but the last, and the test pair.

    Returns ``(train_hist, train_target, test_hist, test_target)``; histories are left-padded
    with ``-1``. Sessions must be sequences of item ids in ``[0, n_items)`` of length >= 3.
    """
    train_h, train_t, test_h, test_t = [], [], [], []
    check_count(history, "history", minimum=1)
    for u, s in enumerate(sessions):
        s = np.asarray(s)
        if s.ndim != 1 or len(s) < 3:
            raise ValueError(f"session {u} must be a 1-D sequence of at least 3 items")
        if not np.issubdtype(s.dtype, np.integer):
            raise TypeError(f"session {u} must hold integer item ids, got {s.dtype}")
        if s.min() < 0 or s.max() >= n_items:
            raise ValueError(f"session {u} refers to an unknown item (ids must lie in "
                             f"[0, {n_items}), got {s.min()}..{s.max()})")
        padded = np.concatenate([np.full(history, -1), s])
        for t in range(1, len(s)):
            h = padded[t:t + history]
            (test_h if t == len(s) - 1 else train_h).append(h)
            (test_t if t == len(s) - 1 else train_t).append(s[t])
    as_t = lambda a: torch.from_numpy(np.array(a, dtype=np.int64))  # noqa: E731
    return as_t(train_h), as_t(train_t), as_t(test_h), as_t(test_t)


class SemanticIdRecommender(nn.Module):
    """GRU over the history's semantic IDs; a GRU-cell decoder emits the next item's tokens."""

    def __init__(self, tokens, dim: int = 48):
        super().__init__()
        tokens = torch.as_tensor(np.asarray(tokens), dtype=torch.long)
        self.register_buffer("tokens", tokens)
        self.vocab = tuple(int(tokens[:, lev].max()) + 1 for lev in range(tokens.shape[1]))
        self.item_emb = nn.ModuleList([nn.Embedding(v, dim) for v in self.vocab])
        self.pad = nn.Parameter(torch.zeros(dim))
        self.gru = nn.GRU(dim, dim, batch_first=True)
        self.start = nn.Parameter(torch.zeros(dim))
        self.tok_emb = nn.ModuleList([nn.Embedding(v, dim) for v in self.vocab])
        self.cell = nn.GRUCell(dim, dim)
        self.heads = nn.ModuleList([nn.Linear(dim, v) for v in self.vocab])

    def encode(self, hist: Tensor) -> Tensor:
        safe = hist.clamp_min(0)
        tok = self.tokens[safe]  # (n, H, L')
        e = sum(emb(tok[..., lev]) for lev, emb in enumerate(self.item_emb))
        e = torch.where((hist < 0)[..., None], self.pad.expand_as(e), e)
        _, h = self.gru(e)
        return h[0]

    def step(self, s: Tensor, level: int, token: Tensor | None) -> Tensor:
        x = self.start.expand(s.shape[0], -1) if token is None else self.tok_emb[level - 1](token)
        return self.cell(x, s)

    def loss(self, hist: Tensor, target: Tensor) -> Tensor:
        s = self.encode(hist)
        tok = self.tokens[target]
        total = hist.new_zeros((), dtype=torch.float32)
        for lev, head in enumerate(self.heads):
            s = self.step(s, lev, None if lev == 0 else tok[:, lev - 1])
            total = total + nn.functional.cross_entropy(head(s), tok[:, lev])
        return total


def train_recommender(tokens, sessions, n_items: int, *, dim: int = 48, history: int = 8,
                      epochs: int = 8, batch: int = 256, lr: float = 3e-3, seed: int = 0):
    """Fit :class:`SemanticIdRecommender` by teacher forcing; return ``(model, test pairs)``."""
    train_h, train_t, test_h, test_t = make_examples(sessions, n_items, history)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = SemanticIdRecommender(tokens, dim)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(check_count(epochs, "epochs", minimum=1)):
        perm = torch.randperm(len(train_t), generator=gen)
        for i in range(0, len(perm), batch):
            idx = perm[i:i + batch]
            loss = model.loss(train_h[idx], train_t[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model, (test_h, test_t)


@torch.no_grad()
def beam_search(model: SemanticIdRecommender, trie: Trie, hist: Tensor, beam: int = 10) -> Tensor:
    """Trie-constrained beam search: the ``beam`` best valid items per history, best first.

    Every beam is a valid prefix of some item's ID; returns ``(n, beam)`` item ids (``-1`` when
    fewer than ``beam`` items exist).
    """
    check_count(beam, "beam", minimum=1)
    s = model.encode(hist)
    n, dim = s.shape
    score = torch.full((n, beam), float("-inf"))
    score[:, 0] = 0.0
    node = torch.zeros(n, beam, dtype=torch.long)
    state = s[:, None, :].expand(n, beam, dim).reshape(n * beam, dim)
    token = None
    for lev, head in enumerate(model.heads):
        state = model.step(state, lev, token)
        logp = torch.log_softmax(head(state), -1).view(n, beam, -1)
        child = trie.children[lev][node]  # (n, beam, V_l)
        total = (score[..., None] + logp).masked_fill(child < 0, float("-inf"))
        score, flat = total.view(n, -1).topk(beam, dim=1)
        parent, token = flat // logp.shape[-1], flat % logp.shape[-1]
        node = child.view(n, -1).gather(1, flat).clamp_min(0)
        state = state.view(n, beam, dim).gather(1, parent[..., None].expand(n, beam, dim))
        state = state.reshape(n * beam, dim)
        token = token.reshape(-1)
    items = trie.leaf_to_item[node]
    return torch.where(torch.isfinite(score), items, torch.full_like(items, -1))


def ranking_metrics(ranked: Tensor, target: Tensor, k: int = 10) -> tuple[float, float]:
    """Recall@k (hit rate, one relevant item) and NDCG@k = 1/log2(rank + 2) of the target."""
    hits = ranked[:, :k] == target[:, None]
    found = hits.any(1)
    rank = hits.float().argmax(1)
    ndcg = torch.where(found, 1.0 / torch.log2(rank.float() + 2), torch.zeros(()))
    return float(found.float().mean()), float(ndcg.mean())


def evaluate(tokens, sessions, n_items: int, *, k: int = 10, seed: int = 0, **train_kw):
    """Train a recommender on ``tokens`` (de-duplicated IDs) and return Recall@k and NDCG@k."""
    trie = build_trie(tokens)
    model, (test_h, test_t) = train_recommender(tokens, sessions, n_items, seed=seed, **train_kw)
    ranked = beam_search(model, trie, test_h, beam=max(k, 10))
    return ranking_metrics(ranked, test_t, k)


__all__ = [
    "GEOMETRIES", "Catalogue", "SemanticIdRecommender", "Tokenizer", "Trie", "beam_search",
    "build_trie", "check_curvature", "check_in_ball", "check_positive", "check_sizes",
    "collision_rate", "dedup_tokens", "dist", "evaluate", "expmap0", "fit_codebooks",
    "logmap0",
    "make_catalogue", "make_examples", "mobius_add", "project", "ranking_metrics",
    "reconstruct", "residual_quantize", "train_recommender", "train_tokenizer",
    "usage_perplexity", "RESIDUALS", "dead_codes", "pyramid", "train_tokenizers",
    "epochs_to_reach", "train_tokenizers_clips",
]
