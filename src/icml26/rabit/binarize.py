r"""Residual binarization of one weight matrix: paths, initialisations, the layer, RTN.

A weight $W \in \mathbb R^{m \times n}$ is approximated by $P$ binary paths (chapter Eq.
`eq-residual`)

$$
\hat W = \sum_{p=1}^{P} \operatorname{diag}(g_p)\, B_p \operatorname{diag}(h_p),
\qquad B_p \in \{\pm 1\}^{m \times n},\ g_p \in \mathbb R^m,\ h_p \in \mathbb R^n .
$$

:class:`ResidualBinaryLinear` trains such a layer in one of two modes: ``"independent"`` (one latent
matrix per path, $B_p = \operatorname{sign}(W_p)$) or ``"rabit"`` (one shared latent $W$, and
$B_p = \operatorname{sign}(R_{p-1})$ with $R_0 = W$, $R_p = R_{p-1} - \hat W_p$). Both use the
same straight-through estimator, chosen by ``ste`` (Eq. `eq-rabit-ste`): ``"identity"``
(:func:`sign_ste`, $\partial\operatorname{sign}(r)/\partial r := 1$), ``"clipped"`` (the same,
zeroed where $|r| > 1$) or ``"scale"`` (the path $G_p \operatorname{sign}(r)$ is treated as
$\operatorname{clip}(r, -G_p, G_p)$, so its derivative is $1$ for $|r| \le G_p$ and $0$ beyond,
which is dimensionless and equivariant to rescaling the weights).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

MODES = ("independent", "rabit")
STES = ("identity", "clipped", "scale")


def check_weight(weight: torch.Tensor) -> torch.Tensor:
    """A 2-D floating-point tensor with no NaN or infinity."""
    if not torch.is_tensor(weight):
        raise TypeError(f"weight must be a torch tensor, got {type(weight).__name__}")
    if weight.ndim != 2:
        raise ValueError(f"weight must be 2-D (out_features, in_features), got shape "
                         f"{tuple(weight.shape)}")
    if not weight.dtype.is_floating_point:
        raise TypeError(f"weight must be floating point, got {weight.dtype}")
    if not torch.isfinite(weight).all():
        raise ValueError("weight contains NaN or infinite values")
    return weight


def check_paths(paths) -> int:
    """The number of binary paths: an integer $P \\ge 1$."""
    if isinstance(paths, bool) or not isinstance(paths, numbers.Integral):
        raise TypeError(f"paths must be an integer, got {type(paths).__name__}")
    if paths < 1:
        raise ValueError(f"paths must be at least 1, got {paths}")
    return int(paths)


def check_activations(activations: torch.Tensor, in_features: int) -> torch.Tensor:
    """Calibration inputs of shape ``(samples, in_features)``."""
    if not torch.is_tensor(activations) or activations.ndim != 2:
        raise ValueError("calibration activations must be a 2-D tensor (samples, in_features)")
    if activations.shape[1] != in_features:
        raise ValueError(f"calibration activations have width {activations.shape[1]}, but the "
                         f"weight has {in_features} input features")
    return activations


def binary_sign(x: torch.Tensor) -> torch.Tensor:
    """$\\pm 1$ with $\\operatorname{sign}(0) = +1$, so every entry is a valid bit."""
    return torch.where(x >= 0, 1.0, -1.0).to(x.dtype)


def path_ste(residual: torch.Tensor, scale: torch.Tensor, ste: str = "identity") -> torch.Tensor:
    r"""The path $G_p \odot \operatorname{sign}(r)$ in the forward pass, with the backward pass of
    straight-through estimator ``ste`` (module docstring). ``scale`` is $G_p$, broadcast to ``r``;
    its own gradient is always $\operatorname{sign}(r) \odot \Delta$."""
    if ste not in STES:
        raise ValueError(f"ste must be one of {STES}, got {ste!r}")
    if ste == "identity":
        return scale * sign_ste(residual)
    sign = binary_sign(residual).detach()
    if ste == "clipped":
        clipped = residual.clamp(-1.0, 1.0)
        return scale * (sign + clipped - clipped.detach())
    bound = scale.detach()
    clipped = torch.maximum(torch.minimum(residual, bound), -bound)
    return scale * sign + clipped - clipped.detach()


def sign_ste(x: torch.Tensor) -> torch.Tensor:
    """Forward: :func:`binary_sign`. Backward: identity, the straight-through estimator (Eq.
    `eq-ste`): $\\partial \\operatorname{sign}(x) / \\partial x := 1$."""
    return x + (binary_sign(x) - x).detach()


@dataclass
class BinaryPaths:
    """Signs ``(P, m, n)`` of $\\pm1$, output scales ``(P, m)`` and input scales ``(P, n)``."""

    signs: torch.Tensor
    out_scales: torch.Tensor
    in_scales: torch.Tensor

    @property
    def count(self) -> int:
        return self.signs.shape[0]

    def path_weights(self) -> torch.Tensor:
        """$\\hat W_p = \\operatorname{diag}(g_p) B_p \\operatorname{diag}(h_p)$, stacked."""
        return self.out_scales[:, :, None] * self.signs * self.in_scales[:, None, :]

    def weight(self) -> torch.Tensor:
        """$\\hat W = \\sum_p \\hat W_p$ (Eq. `eq-residual`)."""
        return self.path_weights().sum(0)


def svid(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sign-value-independent decomposition: ``sign(M)`` and the rank-1 fit of ``|M|``.

    $|M| \\approx \\sigma_1 u_1 v_1^\\top$ gives $g = \\sqrt{\\sigma_1} u_1$, $h = \\sqrt{\\sigma_1}
    v_1$ (Eq. `eq-svid`). $|M|$ is non-negative, so its top singular vectors can be taken
    non-negative (Perron–Frobenius); we fix their sign that way.
    """
    u, s, vh = torch.linalg.svd(matrix.abs(), full_matrices=False)
    u1, v1 = u[:, 0], vh[0]
    flip = -1.0 if u1.sum() < 0 else 1.0
    root = s[0].sqrt()
    return binary_sign(matrix), root * flip * u1, root * flip * v1


def residual_svid(weight: torch.Tensor, paths: int = 2, rounds: int = 0,
                  in_importance: torch.Tensor | None = None,
                  out_importance: torch.Tensor | None = None) -> BinaryPaths:
    """Greedy residual SVID, then ``rounds`` of refitting each path to what the others leave.

    With importances $s^{in}, s^{out}$ the decomposition is done on
    $\\operatorname{diag}(s^{out}) W \\operatorname{diag}(s^{in})$ and the scales are divided
    back (Eq. `eq-importance`); with none it minimises the weight error (Eq. `eq-svid`).
    """
    weight = check_weight(weight)
    paths = check_paths(paths)
    m, n = weight.shape
    s_out = torch.ones(m, dtype=weight.dtype) if out_importance is None else out_importance
    s_in = torch.ones(n, dtype=weight.dtype) if in_importance is None else in_importance
    if s_out.shape != (m,) or s_in.shape != (n,) or (s_out <= 0).any() or (s_in <= 0).any():
        raise ValueError("importances must be positive vectors of length out/in features")
    target = s_out[:, None] * weight * s_in[None, :]
    parts = [list(svid(target))]
    for _ in range(1, paths):
        done = sum(g[:, None] * b * h[None, :] for b, g, h in parts)
        parts.append(list(svid(target - done)))
    for _ in range(rounds):
        for p in range(paths):
            others = sum(g[:, None] * b * h[None, :] for q, (b, g, h) in enumerate(parts)
                         if q != p)
            parts[p] = list(svid(target - others))
    signs, gs, hs = (torch.stack(t) for t in zip(*parts, strict=True))
    return BinaryPaths(signs, gs / s_out[None, :], hs / s_in[None, :])


def output_error(weight: torch.Tensor, approx: torch.Tensor, activations: torch.Tensor) -> float:
    """$\\frac{1}{Nm}\\sum_x \\lVert (W - \\hat W) x \\rVert^2$ over calibration inputs (rows)."""
    check_activations(activations, weight.shape[1])
    return ((activations @ (weight - approx).T) ** 2).mean().item()


def refit_out_scales(weight: torch.Tensor, paths: BinaryPaths,
                     covariance: torch.Tensor, ridge: float = 1e-8) -> BinaryPaths:
    """Output-error-optimal $g$ for fixed signs and input scales (Eq. `eq-output-optimal`).

    Row $i$ of $\\hat W$ is $\\sum_p g_{p,i}\\, a_{p,i}$ with $a_{p,i} = b_{p,i} \\odot h_p$, so
    minimising $(w_i - \\hat w_i)^\\top \\Sigma (w_i - \\hat w_i)$ is a $P \\times P$ least
    squares problem per row: $(A_i^\\top \\Sigma A_i) g_i = A_i^\\top \\Sigma w_i$.
    """
    weight = check_weight(weight)
    n = weight.shape[1]
    if covariance.shape != (n, n):
        raise ValueError(f"covariance must be {n} x {n}, got {tuple(covariance.shape)}")
    rows = paths.signs * paths.in_scales[:, None, :]  # a_{p,i}: (P, m, n)
    weighted = rows @ covariance  # a_{p,i}^T Sigma
    gram = torch.einsum("pmn,qmn->mpq", weighted, rows)
    rhs = torch.einsum("pmn,mn->mp", weighted, weight)
    scale = gram.diagonal(dim1=1, dim2=2).mean(-1, keepdim=True)[..., None]
    eye = torch.eye(paths.count, dtype=weight.dtype)
    g = torch.linalg.solve(gram + ridge * scale * eye, rhs[..., None])[..., 0]
    return BinaryPaths(paths.signs, g.T.contiguous(), paths.in_scales)


def positive_scales(paths: BinaryPaths) -> BinaryPaths:
    r"""The same path weights with every scale made non-negative.

    $\operatorname{diag}(g) B \operatorname{diag}(h)$ is unchanged when $g_i$ and row $i$ of $B$
    change sign together (and likewise $h_j$ and column $j$). A least-squares refit
    (Eq. `eq-output-optimal`) can return $g_{p,i} < 0$; with $G_1 < 0$ RaBiT's sequential
    derivation cannot reach the signs $b_2 \ne b_1$ at all (path 2 then always repeats path 1),
    so the initial paths are put in this form before a latent is derived from them.
    """
    row_flip = torch.where(paths.out_scales < 0, -1.0, 1.0).to(paths.out_scales.dtype)
    col_flip = torch.where(paths.in_scales < 0, -1.0, 1.0).to(paths.in_scales.dtype)
    signs = paths.signs * row_flip[:, :, None] * col_flip[:, None, :]
    return BinaryPaths(signs, paths.out_scales * row_flip, paths.in_scales * col_flip)


def function_aware_init(weight: torch.Tensor, activations: torch.Tensor, paths: int = 2,
                        rounds: int = 2) -> BinaryPaths:
    """Our reconstruction of the paper's function-preserving initialisation.

    1. input-channel importance $s^{in}_j = \\sqrt{E[x_j^2]}$ from calibration inputs;
    2. iterative residual SVID on $W \\operatorname{diag}(s^{in})$ (Eq. `eq-importance`);
    3. output scales refitted to minimise $E\\lVert (W - \\hat W)x \\rVert^2$
       (Eq. `eq-output-optimal`), then made non-negative by :func:`positive_scales` (the same
       $\\hat W$).
    """
    weight = check_weight(weight)
    activations = check_activations(activations, weight.shape[1]).to(weight.dtype)
    second_moment = activations.T @ activations / activations.shape[0]
    in_importance = second_moment.diagonal().clamp_min(1e-12).sqrt()
    decomposition = residual_svid(weight, paths, rounds, in_importance=in_importance)
    return positive_scales(refit_out_scales(weight, decomposition, second_moment))


def consistent_latent(weight: torch.Tensor, paths: BinaryPaths,
                      margin: float = 1e-3) -> torch.Tensor:
    """The latent closest to ``weight`` whose sequential derivation gives ``paths``' signs.

    RaBiT recomputes $B_p = \\operatorname{sign}(W - \\sum_{q<p} \\hat W_q)$, so the latent must
    satisfy $b_p (w - c_p) > 0$ with $c_p = \\sum_{q<p} G_q b_q$ for every $p$: an interval per
    entry (Eq. `eq-consistent-latent`). The offsets $c_p$ accumulate the *signed* path weights
    $G_q b_q$, so the latent is right also where a least-squares scale makes $G_q < 0$.
    We project ``weight`` onto it, ``margin`` (relative to the interval, capped) away from its
    ends. For $P = 2$ with $G_1 > 0$ the interval is never empty (:func:`positive_scales`
    ensures it); an empty one gets its midpoint and that entry is not reproduced exactly.
    """
    weight = check_weight(weight)
    path_weights = paths.path_weights()  # the signed G_p * b_p
    lower = torch.full_like(weight, -torch.inf)
    upper = torch.full_like(weight, torch.inf)
    offset = torch.zeros_like(weight)
    for sign, path in zip(paths.signs, path_weights, strict=True):
        lower = torch.where(sign > 0, torch.maximum(lower, offset), lower)
        upper = torch.where(sign < 0, torch.minimum(upper, offset), upper)
        offset = offset + path  # c_{p+1} = c_p + G_p b_p, whatever the sign of G_p
    width = upper - lower
    gap = torch.where(torch.isfinite(width), width * margin,
                      margin * path_weights[0].abs()).clamp_min(torch.finfo(weight.dtype).tiny)
    projected = torch.minimum(torch.maximum(weight, lower + gap), upper - gap)
    midpoint = 0.5 * (lower + upper)
    return torch.where(width > 0, projected, midpoint)


class ResidualBinaryLinear(nn.Module):
    """A Linear layer with $P$ residual binary paths, trainable with the STE in two modes.

    * ``mode="rabit"``: one latent matrix; every forward pass derives path $p$ from the current
      residual, $B_p = \\operatorname{sign}(R_{p-1})$ (Eq. `eq-rabit`).
    * ``mode="independent"``: one latent matrix per path, $B_p = \\operatorname{sign}(W_p)$
      (Eq. `eq-independent`).

    Both start from ``paths`` and compute exactly its $\\hat W$: the RaBiT latent is
    :func:`consistent_latent`, and the independent latents are the RaBiT residuals
    $R_0, R_1, \\dots$ at initialisation, so both modes also start equally far from every sign
    flip. ``frozen`` freezes the first paths (signs and scales): the path-freezing baseline.
    """

    def __init__(self, weight: torch.Tensor, paths: BinaryPaths, bias: torch.Tensor | None = None,
                 mode: str = "rabit", frozen: int = 0, ste: str = "identity") -> None:
        super().__init__()
        if ste not in STES:
            raise ValueError(f"ste must be one of {STES}, got {ste!r}")
        self.ste = ste
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if not 0 <= frozen < paths.count:
            raise ValueError(f"frozen must be in [0, {paths.count}), got {frozen}")
        if mode == "rabit" and frozen:
            raise ValueError("path freezing is a baseline for independent paths only")
        weight = check_weight(weight).detach()
        if paths.signs.shape[1:] != weight.shape:
            raise ValueError("paths and weight have different shapes")
        self.mode, self.frozen = mode, frozen
        self.out_features, self.in_features = weight.shape
        latent = consistent_latent(weight, paths)
        self.out_scales = nn.ParameterList(nn.Parameter(g.clone()) for g in paths.out_scales)
        self.in_scales = nn.ParameterList(nn.Parameter(h.clone()) for h in paths.in_scales)
        if mode == "rabit":
            self.latents = nn.ParameterList([nn.Parameter(latent)])
        else:
            residuals = latent - torch.cumsum(paths.path_weights(), 0)[:-1]
            self.latents = nn.ParameterList(
                nn.Parameter(r.clone()) for r in torch.cat([latent[None], residuals]))
        for p in range(frozen):
            for group in (self.out_scales, self.in_scales, self.latents):
                group[p].requires_grad_(False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())

    @property
    def count(self) -> int:
        return len(self.out_scales)

    def _signs_and_paths(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        signs, weights = [], []
        residual = self.latents[0]
        for p in range(self.count):
            source = residual if self.mode == "rabit" else self.latents[p]
            scale = self.out_scales[p][:, None] * self.in_scales[p][None, :]
            path = path_ste(source, scale, self.ste)
            signs.append(binary_sign(source.detach()))
            weights.append(path)
            residual = residual - path
        return signs, weights

    def path_weights(self) -> list[torch.Tensor]:
        """$\\hat W_1, \\dots, \\hat W_P$ as differentiable functions of the latents and scales."""
        return self._signs_and_paths()[1]

    def weight(self) -> torch.Tensor:
        return torch.stack(self.path_weights()).sum(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight(), self.bias)

    def export(self) -> BinaryPaths:
        """The current signs and scales, detached: what inference stores."""
        with torch.no_grad():
            signs, _ = self._signs_and_paths()
            return BinaryPaths(torch.stack(signs), torch.stack(list(self.out_scales)).clone(),
                               torch.stack(list(self.in_scales)).clone())

    @property
    def latent_elements(self) -> int:
        """Trainable latent-weight elements (Adam keeps two moments for each)."""
        return sum(t.numel() for t in self.latents if t.requires_grad)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"paths={self.count}, mode={self.mode!r}, frozen={self.frozen}, ste={self.ste!r}")


def ordering_violations(paths: BinaryPaths) -> float:
    r"""Fraction of entries where $0 < G_2 < G_1$ fails ($G_p = g_p h_p^\top$, two paths).

    Eq. `eq-nearest` (RaBiT = round-to-nearest) needs that ordering; the output-scale refit
    (Eq. `eq-output-optimal`) is an unconstrained least-squares fit and need not respect it.
    """
    if paths.count != 2:
        raise ValueError(f"the ordering is defined for two paths, got {paths.count}")
    G = paths.out_scales[:, :, None] * paths.in_scales[:, None, :]
    good = (G[1] > 0) & (G[1] < G[0])
    return float(1.0 - good.double().mean())


class UniformQATLinear(nn.Module):
    r"""A Linear layer quantised to $2^b$ uniform levels $s_i \{-2^{b-1}, \dots, 2^{b-1}-1\}$
    per output row, trained with LSQ: the STE for the rounding and a learned step $s_i$ whose
    gradient is scaled by $1/\sqrt{n\,Q_P}$ (Esser et al.). The step starts at the LSQ value
    $2\,\overline{|w_i|}/\sqrt{Q_P}$, $Q_P = 2^{b-1} - 1$ (or 1 when that is 0)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 bits: int = 2) -> None:
        super().__init__()
        weight = check_weight(weight).detach()
        if isinstance(bits, bool) or not isinstance(bits, numbers.Integral) or not 2 <= bits <= 8:
            raise ValueError(f"bits must be an integer in [2, 8], got {bits!r}")
        self.bits = int(bits)
        self.low, self.high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        positive = max(self.high, 1)
        self.latent = nn.Parameter(weight.clone())
        self.step = nn.Parameter(2 * weight.abs().mean(1) / positive**0.5)
        self.grad_scale = 1.0 / (weight.shape[1] * positive) ** 0.5
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())

    def weight(self) -> torch.Tensor:
        step = self.step * self.grad_scale + (self.step - self.step * self.grad_scale).detach()
        ratio = (self.latent / step[:, None]).clamp(self.low, self.high)
        rounded = ratio + (torch.round(ratio) - ratio).detach()
        return rounded * step[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight(), self.bias)


def rtn_quantize(weight: torch.Tensor, bits: int = 2) -> tuple[torch.Tensor, torch.Tensor,
                                                               torch.Tensor]:
    """Round-to-nearest asymmetric per-output-channel quantisation (Eq. `eq-rtn`).

    The grid of row $i$ spans $[\\min(0, \\min_j w_{ij}), \\max(0, \\max_j w_{ij})]$ with
    $2^b$ levels: scale $s_i$ = range / $(2^b - 1)$, zero point $z_i$ = round$(-\\min / s_i)$.
    Returns the fake-quantised weight, the scales and the zero points; the arithmetic mirrors
    ``torch.fake_quantize_per_channel_affine`` so the two agree bit for bit.
    """
    weight = check_weight(weight).float()
    if isinstance(bits, bool) or not isinstance(bits, numbers.Integral) or not 1 <= bits <= 8:
        raise ValueError(f"bits must be an integer in [1, 8], got {bits!r}")
    top = 2**bits - 1
    low = weight.min(dim=1).values.clamp(max=0.0)
    high = weight.max(dim=1).values.clamp(min=0.0)
    scale = ((high - low) / top).clamp_min(torch.finfo(torch.float32).eps)
    zero_point = torch.clamp(torch.round(-low / scale), 0, top).to(torch.int32)
    inverse = (1.0 / scale)[:, None]
    levels = torch.clamp(torch.round(weight * inverse) + zero_point[:, None], 0, top)
    return (levels - zero_point[:, None]) * scale[:, None], scale, zero_point
