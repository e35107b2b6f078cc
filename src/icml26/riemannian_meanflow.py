"""Riemannian MeanFlow on the sphere S^2: flow maps, their identities, training and sampling.

Chapter ``riemannian-meanflow`` of the book. The module has five parts.

* **Geometry** of the unit sphere embedded in R^3 (or any R^D): :func:`expmap`, :func:`logmap`,
  :func:`sq_dist`, :func:`geodesic` and the conditional velocity of the geodesic path
  ({eq}`eq-rmf-geodesic-path`, {eq}`eq-rmf-cond-velocity`). Every function works in float32 and
  float64, has finite forward-mode derivatives everywhere except at the cut locus (antipodal
  points), and rejects points off the sphere with a ``ValueError``.
* **Identities**: the Eulerian target {eq}`eq-rmf-eulerian` (two ``torch.func.jvp`` calls), the
  semigroup residual {eq}`eq-rmf-flow-map`, and :class:`RotationFlow`, an analytic
  non-autonomous rotation flow on which both hold exactly.
* **Models**: :class:`FlowMapNet`, a small MLP with an average-velocity head or an endpoint
  (x1-prediction) head ({eq}`eq-rmf-endpoint`), and its flow map {eq}`eq-rmf-flow-map-exp`;
  :class:`StackedFlowMapNet`, many independent copies evaluated with batched matrix products.
* **Training**: :func:`flow_matching_loss` (the RFM baseline), :func:`eulerian_loss` and
  :func:`semigroup_loss` (RMF), :func:`train` (one network) and :func:`train_stacked` (one
  network per unit, all at once).
* **Sampling and evaluation**: :func:`sample_flow_map` (RMF, n steps), :func:`sample_euler`
  (RFM, exp-map Euler), :func:`sample_guided` (reward look-ahead or current-state guidance),
  the targets :func:`spiral`, :func:`hard_spiral`, :func:`vmf_mixture` and the point-like
  control :func:`point_target`, and :func:`mmd`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import jvp

from .core import check_count, check_positive

# --- Geometry --------------------------------------------------------------------------------

_ON_SPHERE_TOL = {torch.float32: 1e-4, torch.float64: 1e-6}
_SMALL_SQ = {torch.float32: 1e-8, torch.float64: 1e-16}  # squared norms below: Taylor branch


def _float_dtype(x: Tensor, name: str) -> torch.dtype:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _ON_SPHERE_TOL:
        raise TypeError(f"{name} must be float32 or float64, got {x.dtype}")
    return x.dtype


def check_on_sphere(x: Tensor, name: str = "x") -> Tensor:
    """Return ``x`` if every row (last axis) is a finite unit vector, else raise ``ValueError``."""
    dtype = _float_dtype(x, name)
    if x.ndim < 1 or x.shape[-1] < 2:
        raise ValueError(f"{name} must have points along its last axis (D >= 2), "
                         f"got {tuple(x.shape)}")
    x_value = x.detach()
    if not bool(torch.isfinite(x_value).all()):
        raise ValueError(f"{name} contains NaN or infinite values")
    err = (x_value.norm(dim=-1) - 1).abs().max()
    if float(err) > _ON_SPHERE_TOL[dtype]:
        raise ValueError(f"{name} is off the unit sphere (largest | |x| - 1 | = {float(err):.3g})")
    return x


def check_tangent(x: Tensor, u: Tensor, name: str = "u") -> Tensor:
    """Return ``u`` if it lies in the tangent spaces T_x S (``<x, u> = 0``), else ``ValueError``."""
    _float_dtype(u, name)
    if u.shape != x.shape:
        raise ValueError(f"{name} must have the shape of the base points {tuple(x.shape)}, "
                         f"got {tuple(u.shape)}")
    x_value, u_value = x.detach(), u.detach()
    if not bool(torch.isfinite(u_value).all()):
        raise ValueError(f"{name} contains NaN or infinite values")
    inner = (x_value * u_value).sum(-1).abs()
    bound = _ON_SPHERE_TOL[u.dtype] * (1 + u_value.norm(dim=-1))
    if bool((inner > bound).any()):
        raise ValueError(f"{name} is not tangent at x "
                         f"(largest |<x, u>| = {float(inner.max()):.3g})")
    return u


def projx(x: Tensor) -> Tensor:
    """Radial projection of ambient points onto the sphere."""
    return x / x.norm(dim=-1, keepdim=True)


def proju(x: Tensor, u: Tensor) -> Tensor:
    """Orthogonal projection of ambient vectors ``u`` onto the tangent spaces T_x S."""
    return u - (x * u).sum(-1, keepdim=True) * x


def _exp(x: Tensor, u: Tensor) -> Tensor:
    """:func:`expmap` without input checks (inner loops of training and sampling)."""
    n2 = (u * u).sum(-1, keepdim=True)
    small = n2 < _SMALL_SQ[u.dtype]
    n = torch.sqrt(torch.where(small, torch.ones_like(n2), n2))
    cos_n = torch.where(small, 1 - n2 / 2, torch.cos(n))
    sinc = torch.where(small, 1 - n2 / 6, torch.sin(n) / n)
    return projx(cos_n * x + sinc * u)


def expmap(x: Tensor, u: Tensor) -> Tensor:
    """Exponential map exp_x(u) = cos|u| x + sin|u| u/|u| ({eq}`eq-rmf-exp-log`).

    ``u = 0`` returns ``x`` (a Taylor branch keeps every derivative finite there). ``x`` must lie
    on the sphere and ``u`` in T_x S; the result is re-normalised against rounding drift.
    """
    check_on_sphere(x)
    check_tangent(x, u)
    return _exp(x, u)


def _log(x: Tensor, y: Tensor, at_cut: str = "zero") -> Tensor:
    """:func:`logmap` without the on-sphere checks (inner loops); ``at_cut`` as there."""
    eps = _SMALL_SQ[x.dtype]
    c = (x * y).sum(-1, keepdim=True).clamp(-1, 1)
    w = y - c * x
    r2 = (w * w).sum(-1, keepdim=True)
    small = r2 < eps
    antipodal = small & (c < 0)
    if at_cut == "raise" and bool(antipodal.any()):
        raise ValueError("y is antipodal to x (the cut locus): log_x(y) is not unique")
    r = torch.sqrt(torch.where(small, torch.ones_like(r2), r2))
    c_safe = torch.where(small & (c > 0), c, torch.ones_like(c))
    factor = torch.where(small, 1 / c_safe - r2 / (3 * c_safe**3), torch.atan2(r, c) / r)
    return torch.where(antipodal, torch.zeros_like(w), factor * w)


def logmap(x: Tensor, y: Tensor, *, at_cut: str = "raise") -> Tensor:
    """Logarithm map log_x(y) = d(x, y) (y - <x,y> x)/|y - <x,y> x| ({eq}`eq-rmf-exp-log`).

    Computed as ``atan2(r, c) / r * w`` with ``w = y - c x``, ``c = <x, y>``, ``r = |w|``, which is
    accurate at every distance, with a Taylor branch near ``y = x`` so that forward-mode
    derivatives stay finite (``D_x log_x(y)[v] = -v`` at ``y = x``). At the cut locus
    (``y = -x``) the logarithm is not unique: ``at_cut="raise"`` raises ``ValueError``,
    ``at_cut="zero"`` returns the zero vector there (used inside network heads, where an exact
    antipode has probability zero but must never produce NaN).
    """
    if at_cut not in ("raise", "zero"):
        raise ValueError(f"at_cut must be 'raise' or 'zero', got {at_cut!r}")
    check_on_sphere(x)
    check_on_sphere(y, "y")
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same shape, got {tuple(x.shape)}, "
                         f"{tuple(y.shape)}")
    return _log(x, y, at_cut)


def _sq_dist(x: Tensor, y: Tensor) -> Tensor:
    """:func:`sq_dist` without input checks."""
    c2 = ((x - y) ** 2).sum(-1)
    small = c2 < _SMALL_SQ[x.dtype]
    c = torch.sqrt(torch.where(small, torch.ones_like(c2), c2))
    half = torch.clamp(c / 2, max=1.0)
    return torch.where(small, c2 + c2**2 / 12, (2 * torch.asin(half)) ** 2)


def sq_dist(x: Tensor, y: Tensor) -> Tensor:
    """Squared geodesic distance d(x, y)^2 = (2 asin(|x - y|/2))^2, smooth at ``x = y``."""
    check_on_sphere(x)
    check_on_sphere(y, "y")
    return _sq_dist(x, y)


def dist(x: Tensor, y: Tensor) -> Tensor:
    """Geodesic distance on the sphere (the arc length), in [0, pi]."""
    return torch.sqrt(sq_dist(x, y))


def _check_times(t: Tensor, s: Tensor | None = None) -> None:
    for value, name in ((t, "t"), (s, "s")):
        if value is None:
            continue
        value = value.detach()
        if not bool(torch.isfinite(value).all()):
            raise ValueError(f"{name} contains NaN or infinite values")
        if bool(((value < 0) | (value > 1)).any()):
            raise ValueError(f"times must lie in [0, 1], got {name} in "
                             f"[{float(value.min()):.3g}, {float(value.max()):.3g}]")
    if s is not None and bool((s.detach() < t.detach()).any()):
        raise ValueError("the flow map X_{t,s} needs s >= t (forward in time)")


def _time(value, like: Tensor, name: str) -> Tensor:
    """Broadcast a scalar or a per-row time to a column ``(..., 1)`` matching ``like``."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = torch.full(like.shape[:-1], float(value), dtype=like.dtype)
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a number or a tensor, got {type(value).__name__}")
    value = value.to(like.dtype)
    if value.shape != like.shape[:-1]:
        value = value.expand(like.shape[:-1])
    return value


def geodesic(x0: Tensor, x1: Tensor, t) -> Tensor:
    """The geodesic interpolant x_t = exp_{x0}(t log_{x0} x1) ({eq}`eq-rmf-geodesic-path`)."""
    t = _time(t, x0, "t")
    _check_times(t)
    return expmap(x0, t[..., None] * logmap(x0, x1))


def conditional_velocity(xt: Tensor, x1: Tensor, t) -> Tensor:
    """Velocity of the geodesic path at x_t: log_{x_t}(x1)/(1 - t) ({eq}`eq-rmf-cond-velocity`).

    Requires ``t < 1`` (the path reaches x1 at t = 1, where the ratio is 0/0).
    """
    t = _time(t, xt, "t")
    _check_times(t)
    if bool((t >= 1).any()):
        raise ValueError("the conditional velocity needs t < 1")
    return logmap(xt, x1) / (1 - t[..., None])


def _uniform_sphere(n: int, dim: int, generator: torch.Generator, dtype) -> Tensor:
    return projx(torch.randn(n, dim, generator=generator, dtype=dtype))


def uniform_sphere(n: int, dim: int = 3, *, seed: int = 0, dtype=torch.float64) -> Tensor:
    """``n`` points uniform on S^{dim-1} (normalised Gaussians): the prior p_0."""
    n, dim = check_count(n, "n", 1), check_count(dim, "dim", 2)
    generator = torch.Generator().manual_seed(check_count(seed, "seed"))
    return _uniform_sphere(n, dim, generator, dtype)


# --- Identities on an analytic flow ----------------------------------------------------------


def _skew(axis: Tensor) -> Tensor:
    a, b, c = axis.unbind()
    zero = torch.zeros((), dtype=axis.dtype)
    return torch.stack([torch.stack([zero, -c, b]), torch.stack([c, zero, -a]),
                        torch.stack([-b, a, zero])])


@dataclass
class RotationFlow:
    """The non-autonomous rotation field v_t(x) = (1 + t^2) Omega x on S^2 ({eq}`eq-rmf-rotation`).

    ``Omega`` is the skew matrix of ``axis`` (its norm is the angular speed at t = 0). The flow map
    is the rotation X_{t,s} = exp((F(s) - F(t)) Omega), F(t) = t + t^3/3, in closed form
    (Rodrigues' formula), so every identity of the chapter can be checked on it exactly.
    """

    axis: Tensor = field(
        default_factory=lambda: torch.tensor([0.3, -0.5, 0.8], dtype=torch.float64))

    def __post_init__(self):
        if not isinstance(self.axis, Tensor) or self.axis.shape != (3,):
            raise ValueError("axis must be a tensor of shape (3,)")
        self.omega = _skew(self.axis)

    @staticmethod
    def time_change(t: Tensor) -> Tensor:
        return t + t**3 / 3

    def velocity(self, x: Tensor, t: Tensor) -> Tensor:
        t = _time(t, x, "t")
        return (1 + t[..., None] ** 2) * (x @ self.omega.T.to(x.dtype))

    def rotation(self, angle: Tensor) -> Tensor:
        """exp(angle * Omega) for a batch of angles, by Rodrigues' formula; shape (..., 3, 3)."""
        omega = self.omega.to(angle.dtype)
        speed = self.axis.to(angle.dtype).norm()
        k = omega / speed
        theta = (angle * speed)[..., None, None]
        eye = torch.eye(3, dtype=angle.dtype)
        return eye + torch.sin(theta) * k + (1 - torch.cos(theta)) * (k @ k)

    def flow(self, x: Tensor, t, s) -> Tensor:
        """X_{t,s}(x), exact."""
        t, s = _time(t, x, "t"), _time(s, x, "s")
        rot = self.rotation(self.time_change(s) - self.time_change(t))
        return (rot @ x[..., None])[..., 0]

    def average_velocity(self, x: Tensor, t, s) -> Tensor:
        """u_{t,s}(x) = log_x(X_{t,s}(x))/(s - t) ({eq}`eq-rmf-average-velocity`), for s > t."""
        t, s = _time(t, x, "t"), _time(s, x, "s")
        return logmap(x, self.flow(x, t, s)) / (s - t)[..., None]


def _jump(u_fn: Callable, x: Tensor, t, s) -> Tensor:
    """:func:`flow_map_from_velocity` without input checks (inner loops)."""
    t, s = _time(t, x, "t"), _time(s, x, "s")
    return _exp(x, (s - t)[..., None] * u_fn(x, t, s))


def flow_map_from_velocity(u_fn: Callable, x: Tensor, t, s) -> Tensor:
    """X_{t,s}(x) = exp_x((s - t) u_{t,s}(x)) ({eq}`eq-rmf-flow-map-exp`)."""
    check_on_sphere(x)
    t, s = _time(t, x, "t"), _time(s, x, "s")
    _check_times(t, s)
    return _jump(u_fn, x, t, s)


def eulerian_target(u_fn: Callable, x: Tensor, t: Tensor, s: Tensor, v: Tensor, *,
                    check: bool = True):
    """The right side of the Riemannian MeanFlow identity {eq}`eq-rmf-eulerian`.

    Returns ``(u, target)`` with ``u = u_{t,s}(x)`` and
    ``target = (s - t) P_x[d/dt u_{t,s}(x_t)] - P_x[D_x log_x(y)[v]]`` at ``y = X_{t,s}(x)`` held
    fixed. The total derivative ``d/dt u = D_x u[v] + d_t u`` is one forward-mode JVP with
    tangent ``(v, 1)`` in ``(x, t)``; the second JVP differentiates the logarithm in its base point.
    The identity holds (``u == target``) exactly when ``u`` is the average velocity of the flow
    of ``v``; with the conditional velocity it is the regression target of the Eulerian loss.
    ``check=False`` skips the input checks (the training loop).
    """
    if check:
        check_on_sphere(x)
        check_tangent(x, v, "v")
        t, s = _time(t, x, "t"), _time(s, x, "s")
        _check_times(t, s)

    def u_of(x_, t_):
        return u_fn(x_, t_, s)

    u, du_dt = jvp(u_of, (x, t), (v, torch.ones_like(t)))
    du_dt = proju(x, du_dt)
    y = _exp(x, (s - t)[..., None] * u).detach()
    _, dlog = jvp(lambda x_: _log(x_, y), (x,), (v,))
    dlog = proju(x, dlog)
    return u, (s - t)[..., None] * du_dt - dlog


def semigroup_residual(u_fn: Callable, x: Tensor, t, s, r) -> Tensor:
    """d(X_{t,r}(x), X_{s,r}(X_{t,s}(x))) for t <= s <= r ({eq}`eq-rmf-flow-map`), per point."""
    t, s, r = _time(t, x, "t"), _time(s, x, "s"), _time(r, x, "r")
    _check_times(t, s)
    _check_times(s, r)
    direct = flow_map_from_velocity(u_fn, x, t, r)
    two_hops = flow_map_from_velocity(u_fn, flow_map_from_velocity(u_fn, x, t, s), s, r)
    return dist(direct, two_hops)


def dlog_closed_form(x: Tensor, y: Tensor, v: Tensor) -> Tensor:
    """-D_x log_x(y)[v] on the unit sphere: v_par + theta cot(theta) v_perp ({eq}`eq-rmf-jacobi`).

    ``v_par`` is the component of ``v`` along the geodesic from x to y, ``v_perp`` the rest of it,
    and theta = d(x, y). Used to check the JVP of :func:`logmap` against geometry.
    """
    log = logmap(x, y)
    theta = log.norm(dim=-1, keepdim=True)
    e = log / theta.clamp_min(1e-300)
    v_par = (v * e).sum(-1, keepdim=True) * e
    cot = torch.where(theta < 1e-8, torch.ones_like(theta),
                      theta * torch.cos(theta) / torch.sin(theta).clamp_min(1e-300))
    return v_par + cot * (v - v_par)


# --- Targets and the metric ------------------------------------------------------------------


SPIRAL_POLAR = (0.1, 0.6)
"""Polar range of :func:`spiral`, in units of pi: from near the north pole to below the equator."""


def spiral(n: int, *, turns: float = 1.5, noise: float = 0.08, seed: int = 0,
           polar: tuple[float, float] = SPIRAL_POLAR, dtype=torch.float64) -> Tensor:
    """A noisy spiral on S^2 that winds down from near the north pole.

    Draw tau ~ U(0, 1), polar angle pi (a + (b - a) tau) with (a, b) = ``polar`` (default
    :data:`SPIRAL_POLAR`),
    azimuth 2 pi turns tau, then move the point by exp_x of an isotropic tangent Gaussian with
    standard deviation ``noise``.
    """
    n = check_count(n, "n", 1)
    check_positive(turns, "turns")
    if isinstance(noise, bool) or not isinstance(noise, numbers.Real) or noise < 0:
        raise ValueError(f"noise must be a non-negative number, got {noise!r}")
    generator = torch.Generator().manual_seed(check_count(seed, "seed"))
    tau = torch.rand(n, generator=generator, dtype=torch.float64)
    a, b = polar
    if not 0 <= a < b <= 1:
        raise ValueError(f"polar must be (a, b) with 0 <= a < b <= 1, got {polar!r}")
    polar = math.pi * (a + (b - a) * tau)
    azimuth = 2 * math.pi * turns * tau
    x = torch.stack([torch.sin(polar) * torch.cos(azimuth), torch.sin(polar) * torch.sin(azimuth),
                     torch.cos(polar)], -1)
    eps = proju(x, noise * torch.randn(n, 3, generator=generator, dtype=torch.float64))
    return expmap(x, eps).to(dtype)


def spiral_point(tau: float, turns: float = 1.5,
                 polar: tuple[float, float] = SPIRAL_POLAR) -> Tensor:
    """The noise-free spiral point at parameter ``tau`` in [0, 1] (float64, shape (3,))."""
    a, b = polar
    polar, azimuth = math.pi * (a + (b - a) * tau), 2 * math.pi * turns * tau
    return torch.tensor([math.sin(polar) * math.cos(azimuth), math.sin(polar) * math.sin(azimuth),
                         math.cos(polar)], dtype=torch.float64)


def sample_vmf(mu: Tensor, kappa: float, n: int, generator: torch.Generator) -> Tensor:
    """``n`` draws from the von Mises-Fisher distribution on S^2 (mean ``mu``, concentration kappa).

    Exact inversion for S^2: w = <x, mu> = 1 + log(U + (1 - U) e^{-2 kappa})/kappa, with a
    uniform direction in T_mu S^2.
    """
    kappa = check_positive(kappa, "kappa")
    n = check_count(n, "n", 1)
    mu = check_on_sphere(mu.to(torch.float64), "mu")
    if mu.shape != (3,):
        raise ValueError("sample_vmf is written for S^2: mu must have shape (3,)")
    uniform = torch.rand(n, generator=generator, dtype=torch.float64)
    w = 1 + torch.log(uniform + (1 - uniform) * math.exp(-2 * kappa)) / kappa
    w = w.clamp(-1, 1)
    noise = torch.randn(n, 3, generator=generator, dtype=torch.float64)
    direction = proju(mu.expand(n, 3), noise)
    direction = direction / direction.norm(dim=-1, keepdim=True)
    return projx(w[:, None] * mu + torch.sqrt(1 - w[:, None] ** 2) * direction)


VMF_MEANS = projx(torch.tensor([[1.0, 0.2, 0.4], [-0.6, 0.8, 0.1], [0.1, -0.7, 0.7],
                                [-0.3, -0.2, -0.9], [0.7, -0.6, -0.4]], dtype=torch.float64))
"""The five fixed component means of :func:`vmf_mixture`."""


def vmf_mixture(n: int, *, kappa: float = 20.0, seed: int = 0, dtype=torch.float64) -> Tensor:
    """``n`` draws from an equal-weight mixture of five von Mises-Fisher components on S^2."""
    n = check_count(n, "n", 1)
    generator = torch.Generator().manual_seed(check_count(seed, "seed"))
    labels = torch.randint(0, len(VMF_MEANS), (n,), generator=generator)
    out = torch.empty(n, 3, dtype=torch.float64)
    for k, mu in enumerate(VMF_MEANS):
        idx = (labels == k).nonzero().flatten()
        if len(idx):
            out[idx] = sample_vmf(mu, kappa, len(idx), generator)
    return out.to(dtype)


HARD_SPIRAL = dict(turns=3.0, noise=0.05, polar=(0.1, 0.7))
"""The harder spiral: three turns, tangent noise 0.05 rad, reaching well below the equator."""

HARDEST_SPIRAL = dict(turns=5.0, noise=0.05, polar=(0.1, 0.9))
"""Five turns from near the north to near the south pole: not learned at CPU scale."""


def hard_spiral(n: int, *, seed: int = 0, dtype=torch.float64) -> Tensor:
    """:func:`spiral` with :data:`HARD_SPIRAL`: thinner and longer than the default spiral."""
    return spiral(n, seed=seed, dtype=dtype, **HARD_SPIRAL)


def hardest_spiral(n: int, *, seed: int = 0, dtype=torch.float64) -> Tensor:
    """:func:`spiral` with :data:`HARDEST_SPIRAL`: wound five times around the sphere."""
    return spiral(n, seed=seed, dtype=dtype, **HARDEST_SPIRAL)


def point_target(n: int, *, seed: int = 0, dtype=torch.float64) -> Tensor:
    """A single tight von Mises-Fisher component (concentration 400, about 0.05 rad wide).

    The falsification control: for a point mass the marginal flow from a uniform prior runs along
    geodesics at constant speed, so one exponential-map Euler step is already the exact flow map
    and a learned flow map has nothing to gain over it.
    """
    n = check_count(n, "n", 1)
    generator = torch.Generator().manual_seed(check_count(seed, "seed"))
    return sample_vmf(VMF_MEANS[0], 400.0, n, generator).to(dtype)


TARGETS = {"spiral": spiral, "vmf": vmf_mixture, "hard spiral": hard_spiral,
           "hardest spiral": hardest_spiral, "point": point_target}
"""The chapter's data distributions on S^2, by name."""


def vmf_kernel(x: Tensor, y: Tensor, h: float = 0.2) -> Tensor:
    """k(x, y) = exp((<x, y> - 1)/h^2) = exp(-(2 sin(d/2))^2/(2 h^2)) ({eq}`eq-rmf-mmd`).

    A function of the geodesic distance d, equal to the Gaussian exp(-d^2/(2h^2)) up to O(d^4),
    and positive definite on every sphere (it is the Gaussian kernel of the chord).
    """
    h = check_positive(h, "h")
    return torch.exp((x @ y.T - 1) / h**2)


def mmd(x: Tensor, y: Tensor, h: float = 0.2) -> float:
    """Biased (V-statistic) MMD between samples on the sphere under :func:`vmf_kernel`."""
    check_on_sphere(x)
    check_on_sphere(y, "y")
    x, y = x.to(torch.float64), y.to(torch.float64)
    value = (vmf_kernel(x, x, h).mean() + vmf_kernel(y, y, h).mean()
             - 2 * vmf_kernel(x, y, h).mean())
    return float(torch.sqrt(value.clamp_min(0)))


# --- Models ----------------------------------------------------------------------------------


def _capped_tangent(x: Tensor, out: Tensor, max_norm: float) -> Tensor:
    """The network output projected onto the tangent space at ``x``, its norm softly capped at
    ``max_norm`` (``m tanh(|u| / m)``), shared by the plain and the stacked networks."""
    u = proju(x, out)
    r = torch.sqrt((u * u).sum(-1, keepdim=True) + 1e-12)
    return u * (max_norm * torch.tanh(r / max_norm) / r)


class FlowMapNet(nn.Module):
    """A small MLP that represents the average velocity u_{t,s}(x) on S^2.

    Inputs are ``[x, t, s - t]`` plus sines and cosines of ``t`` and ``s - t``.

    * ``head="velocity"``: the output is projected onto T_x S and its norm ``r`` is mapped to
      ``m tanh(r/m)`` with ``m = max_norm`` (default pi - 0.1), so that a step
      ``(s - t) u`` never reaches the cut locus; below ``m`` this is a smooth bijection of norms.
    * ``head="endpoint"``: the output, normalised, is a predicted endpoint x1_hat, and
      ``u = log_x(x1_hat)/(1 - t)`` ({eq}`eq-rmf-endpoint`), with ``1 - t`` clipped at 1e-3.
    """

    def __init__(self, hidden: int = 128, depth: int = 3, head: str = "velocity",
                 dim: int = 3, max_norm: float = math.pi - 0.1, frequencies: int = 3):
        super().__init__()
        if head not in ("velocity", "endpoint"):
            raise ValueError(f"head must be 'velocity' or 'endpoint', got {head!r}")
        hidden, depth = check_count(hidden, "hidden", 1), check_count(depth, "depth", 1)
        self.head, self.dim = head, check_count(dim, "dim", 2)
        self.max_norm = check_positive(max_norm, "max_norm")
        self.register_buffer("freqs", math.pi * torch.arange(1, frequencies + 1).float())
        width_in = dim + 2 + 4 * frequencies
        layers: list[nn.Module] = []
        for i in range(depth):
            layers += [nn.Linear(width_in if i == 0 else hidden, hidden), nn.SiLU()]
        layers.append(nn.Linear(hidden, dim))
        self.net = nn.Sequential(*layers)

    def features(self, x: Tensor, t: Tensor, s: Tensor) -> Tensor:
        gap = s - t
        freqs = self.freqs.to(x.dtype)
        angles = torch.cat([t[:, None] * freqs, gap[:, None] * freqs], -1)
        return torch.cat([x, t[:, None], gap[:, None], torch.sin(angles), torch.cos(angles)], -1)

    def average_velocity(self, x: Tensor, t, s) -> Tensor:
        """u_{t,s}(x) in T_x S (Eq. {eq}`eq-rmf-average-velocity` / {eq}`eq-rmf-endpoint`)."""
        t, s = _time(t, x, "t"), _time(s, x, "s")
        out = self.net(self.features(x, t, s))
        if self.head == "endpoint":
            x1_hat = projx(out)
            return _log(x, x1_hat) / (1 - t).clamp_min(1e-3)[:, None]
        return _capped_tangent(x, out, self.max_norm)

    def velocity(self, x: Tensor, t) -> Tensor:
        """The instantaneous velocity v_t(x) = u_{t,t}(x)."""
        return self.average_velocity(x, t, t)

    def flow_map(self, x: Tensor, t, s) -> Tensor:
        """X_{t,s}(x) = exp_x((s - t) u_{t,s}(x)) ({eq}`eq-rmf-flow-map-exp`)."""
        return flow_map_from_velocity(self.average_velocity, x, t, s)

    def _flow_map(self, x: Tensor, t, s) -> Tensor:
        """:meth:`flow_map` without input checks (training and sampling loops)."""
        return _jump(self.average_velocity, x, t, s)


class StackedFlowMapNet(nn.Module):
    """``units`` independent :class:`FlowMapNet` s evaluated at once with batched matrix products.

    Unit ``i`` is initialised exactly as ``FlowMapNet`` under ``torch.manual_seed(seeds[i])`` and
    keeps its own weights; inputs carry a leading unit axis, ``x`` of shape ``(units, B, dim)`` and
    times of shape ``(units, B)`` (or numbers). A loss that is a sum over units trains the units
    independently (Adam acts elementwise), so ``units`` models train for little more than the
    cost of one on a CPU, where small networks are bound by per-operation overhead.
    :meth:`unit` returns unit ``i`` as a plain :class:`FlowMapNet`.
    """

    def __init__(self, seeds, hidden: int = 128, depth: int = 3, head: str = "velocity",
                 dim: int = 3, max_norm: float = math.pi - 0.1, frequencies: int = 3):
        super().__init__()
        seeds = [check_count(seed, "seed") for seed in seeds]
        if not seeds:
            raise ValueError("seeds must name at least one unit")
        self.config = dict(hidden=hidden, depth=depth, head=head, dim=dim, max_norm=max_norm,
                           frequencies=frequencies)
        nets = []
        for seed in seeds:
            torch.manual_seed(seed)
            nets.append(FlowMapNet(**self.config))
        self.units, self.head, self.dim, self.max_norm = len(seeds), head, dim, nets[0].max_norm
        self.register_buffer("freqs", nets[0].freqs.clone())
        linears = [[m for m in net.net if isinstance(m, nn.Linear)] for net in nets]
        self.weights = nn.ParameterList(
            nn.Parameter(torch.stack([lin[k].weight.detach().T for lin in linears]))
            for k in range(len(linears[0])))
        self.biases = nn.ParameterList(
            nn.Parameter(torch.stack([lin[k].bias.detach()[None] for lin in linears]))
            for k in range(len(linears[0])))

    def unit(self, i: int) -> FlowMapNet:
        """Unit ``i`` as a stand-alone :class:`FlowMapNet` (a copy of its weights)."""
        net = FlowMapNet(**self.config)
        linears = [m for m in net.net if isinstance(m, nn.Linear)]
        with torch.no_grad():
            for lin, w, b in zip(linears, self.weights, self.biases, strict=True):
                lin.weight.copy_(w[i].T)
                lin.bias.copy_(b[i, 0])
        return net.eval()

    def subset(self, indices) -> StackedFlowMapNet:
        """The units ``indices`` (in that order) as a new stacked network (weights copied)."""
        indices = [check_count(i, "index") for i in indices]
        if not indices or max(indices) >= self.units:
            raise ValueError(f"indices must name units in 0..{self.units - 1}")
        new = StackedFlowMapNet.__new__(StackedFlowMapNet)
        nn.Module.__init__(new)
        new.config, new.units, new.head = dict(self.config), len(indices), self.head
        new.dim, new.max_norm = self.dim, self.max_norm
        new.register_buffer("freqs", self.freqs.clone())
        new.weights = nn.ParameterList(nn.Parameter(w.detach()[indices].clone())
                                       for w in self.weights)
        new.biases = nn.ParameterList(nn.Parameter(b.detach()[indices].clone())
                                      for b in self.biases)
        return new.train(self.training)

    def average_velocity(self, x: Tensor, t, s) -> Tensor:
        """u_{t,s}(x) per unit, as :meth:`FlowMapNet.average_velocity`; ``x`` is (units, B, dim)."""
        if x.ndim != 3 or x.shape[0] != self.units:
            raise ValueError(f"x must have shape (units={self.units}, B, dim), "
                             f"got {tuple(x.shape)}")
        t, s = _time(t, x, "t"), _time(s, x, "s")
        gap = s - t
        freqs = self.freqs.to(x.dtype)
        angles = torch.cat([t[..., None] * freqs, gap[..., None] * freqs], -1)
        h = torch.cat([x, t[..., None], gap[..., None], torch.sin(angles), torch.cos(angles)], -1)
        last = len(self.weights) - 1
        for k, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = torch.baddbmm(b, h, w)
            if k < last:
                h = nn.functional.silu(h)
        if self.head == "endpoint":
            return _log(x, projx(h)) / (1 - t).clamp_min(1e-3)[..., None]
        return _capped_tangent(x, h, self.max_norm)

    def velocity(self, x: Tensor, t) -> Tensor:
        """The instantaneous velocity v_t(x) = u_{t,t}(x), per unit."""
        return self.average_velocity(x, t, t)

    def _flow_map(self, x: Tensor, t, s) -> Tensor:
        return _jump(self.average_velocity, x, t, s)


# --- Training --------------------------------------------------------------------------------


def _down_weight(t: Tensor, t_clip: float = 0.1) -> Tensor:
    """((1 - t)/t_clip)^2 for t > 1 - t_clip, else 1: tames the 1/(1 - t) of the path velocity."""
    return torch.where(t > 1 - t_clip, ((1 - t) / t_clip) ** 2, torch.ones_like(t))


@dataclass
class Batch:
    """One training batch: the path point x_t, its conditional velocity, and the times.

    ``t_fm``, ``xt_fm``, ``v_fm`` are the time, path point and conditional velocity of the
    flow-matching term: the same as ``t``, ``xt``, ``v`` for ``times="pair"``, an independent
    uniform time on the same (x0, x1) pairs for ``times="three"``.
    """

    x0: Tensor
    x1: Tensor
    xt: Tensor
    v: Tensor
    t: Tensor
    s: Tensor
    r: Tensor
    t_fm: Tensor
    xt_fm: Tensor
    v_fm: Tensor


TIME_SAMPLERS = ("pair", "three")
"""How :func:`make_batch` draws times: ordered pairs (RFM, Eulerian) or triples (semigroup)."""


def _ordered_pair(n: int, generator: torch.Generator, boundary_ratio: float):
    """t <= s from two uniforms (min, max); a fraction ``boundary_ratio`` of rows has s = t.

    ``t`` is capped at 0.999 (the path velocity has 1/(1 - t)); boundary rows keep s = t exactly.
    """
    raw = torch.rand(n, 2, generator=generator, dtype=torch.float64)
    boundary = torch.rand(n, generator=generator, dtype=torch.float64) < boundary_ratio
    t = torch.where(boundary, raw[:, 0], raw.min(-1).values).clamp(max=0.999)
    s = torch.where(boundary, t, raw.max(-1).values)
    return t, s


def make_batch(x1: Tensor, generator: torch.Generator, *, boundary_ratio: float = 0.75,
               times: str = "pair", min_gap: float = 0.01, dtype=torch.float32) -> Batch:
    """Pair data with prior draws and sample times (path computed in float64, then cast).

    ``times="pair"``: ``t <= s`` are the minimum and maximum of two uniforms, and a fraction
    ``boundary_ratio`` of rows gets ``s = t`` (one uniform), as in MeanFlow; ``r = s``.
    ``boundary_ratio=1`` gives one uniform time per row (flow matching).
    ``times="three"`` (semigroup loss): ``t <= r`` as above with ``r - t >= min_gap`` and
    ``s = (t + r)/2``, the authors' midpoint three-point sampler; the flow-matching term then gets
    its own uniform time, so that it is exactly the RFM baseline's loss. Times are capped at 0.999
    (the path velocity has 1/(1 - t)).
    """
    if not 0 <= boundary_ratio <= 1:
        raise ValueError(f"boundary_ratio must lie in [0, 1], got {boundary_ratio}")
    if times not in TIME_SAMPLERS:
        raise ValueError(f"times must be one of {', '.join(TIME_SAMPLERS)}, got {times!r}")
    if not 0 <= min_gap < 1:
        raise ValueError(f"min_gap must lie in [0, 1), got {min_gap}")
    n = x1.shape[0]
    x1 = projx(x1.to(torch.float64))
    x0 = _uniform_sphere(n, x1.shape[1], generator, torch.float64)
    # redraw the (probability ~1e-16) prior points that fall on the cut locus of their data point
    bad = (x0 * x1).sum(-1) < -1 + 1e-12
    x0[bad] = projx(x0[bad] + 0.1 * torch.randn(int(bad.sum()), x1.shape[1], generator=generator,
                                                dtype=torch.float64))
    t, s = _ordered_pair(n, generator, boundary_ratio)
    if times == "three":
        r = torch.maximum(s, t + min_gap)
        t = torch.where(r > 1, 1 - min_gap, t)
        r = r.clamp(max=1.0)
        s = (t + r) / 2
        t_fm = torch.rand(n, generator=generator, dtype=torch.float64)
    else:
        r = s
        t_fm = t
    log01 = _log(x0, x1)

    def path(time):
        time = time.clamp(max=0.999)
        xt = _exp(x0, time[:, None] * log01)
        v = _log(xt, x1) / (1 - time[:, None])
        xt32 = projx(xt.to(dtype))
        return time.to(dtype), xt32, proju(xt32, v.to(dtype))

    t, xt, v = path(t)
    t_fm, xt_fm, v_fm = (t, xt, v) if times == "pair" else path(t_fm)
    return Batch(x0.to(dtype), x1.to(dtype), xt, v, t, s.to(dtype), r.to(dtype), t_fm, xt_fm,
                 v_fm)


def flow_matching_loss(model: FlowMapNet, batch: Batch) -> Tensor:
    """Riemannian flow matching ({eq}`eq-rmf-rfm-loss`): |u_{t,t}(x_t) - v_t(x_t | x1)|^2.

    Uses the batch's flow-matching time ``t_fm`` (uniform), down-weighted near t = 1."""
    err = model.velocity(batch.xt_fm, batch.t_fm) - batch.v_fm
    return (_down_weight(batch.t_fm) * (err**2).sum(-1)).mean()


def eulerian_loss(model: FlowMapNet, batch: Batch) -> Tensor:
    """RMF Eulerian loss ({eq}`eq-rmf-eulerian-loss`): |u - sg(target)|^2 with the conditional v."""
    u, target = eulerian_target(model.average_velocity, batch.xt, batch.t, batch.s, batch.v,
                                check=False)
    err = u - target.detach()
    return (_down_weight(batch.t) * (err**2).sum(-1)).mean()


def semigroup_loss(model: FlowMapNet, batch: Batch) -> Tensor:
    """RMF semigroup loss ({eq}`eq-rmf-semigroup-loss`): flow matching plus
    d(X_{t,r}(x_t), sg[X_{s,r}(X_{t,s}(x_t))])^2, both down-weighted near t = 1. JVP-free."""
    with torch.no_grad():
        two_hops = model._flow_map(model._flow_map(batch.xt, batch.t, batch.s), batch.s, batch.r)
    direct = model._flow_map(batch.xt, batch.t, batch.r)
    w = _down_weight(batch.t)
    return (w * _sq_dist(direct, two_hops)).mean() + flow_matching_loss(model, batch)


LOSSES = {"rfm": flow_matching_loss, "eulerian": eulerian_loss, "semigroup": semigroup_loss}
"""Training objectives by name: the RFM baseline and the two RMF losses."""

TIME_SETTINGS = {"rfm": ("pair", 1.0), "eulerian": ("pair", 0.75), "semigroup": ("three", 0.0)}
"""Default (time sampler, boundary ratio) per loss, as in the authors' toy configurations: one
uniform time for flow matching, ordered pairs with three quarters of rows at ``s = t`` for the
Eulerian loss, midpoint triples without boundary rows for the semigroup loss (its flow-matching
term anchors the boundary)."""


@dataclass
class TrainResult:
    """A trained model with its loss curve and the wall-clock seconds per step."""

    model: FlowMapNet
    losses: np.ndarray
    seconds_per_step: float


def train(data: Tensor, loss: str, *, steps: int = 2000, batch_size: int = 256, lr: float = 2e-3,
          seed: int = 0, head: str = "velocity", hidden: int = 128, depth: int = 3,
          boundary_ratio: float | None = None) -> TrainResult:
    """Train a :class:`FlowMapNet` on ``data`` (points on S^2) with ``loss`` (a key of LOSSES).

    Adam with a cosine learning-rate decay; float32. Times are drawn as in :data:`TIME_SETTINGS`
    (the RFM baseline uses only ``s = t``); ``boundary_ratio`` overrides the RMF losses' default.
    """
    import time

    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; choose one of {', '.join(LOSSES)}")
    check_on_sphere(data, "data")
    steps, batch_size = check_count(steps, "steps", 1), check_count(batch_size, "batch_size", 1)
    check_positive(lr, "lr")
    torch.manual_seed(check_count(seed, "seed"))
    generator = torch.Generator().manual_seed(seed + 7919)
    model = FlowMapNet(hidden=hidden, depth=depth, head=head, dim=data.shape[1])
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    objective = LOSSES[loss]
    times, ratio = TIME_SETTINGS[loss]
    if boundary_ratio is not None and loss != "rfm":
        ratio = boundary_ratio
    losses = np.empty(steps)
    start = time.perf_counter()
    for step in range(steps):
        idx = torch.randint(0, data.shape[0], (batch_size,), generator=generator)
        batch = make_batch(data[idx], generator, boundary_ratio=ratio, times=times)
        value = objective(model, batch)
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
        schedule.step()
        losses[step] = value.item()
    seconds = (time.perf_counter() - start) / steps
    if not np.all(np.isfinite(losses)):
        raise FloatingPointError(f"training with {loss} produced a non-finite loss")
    return TrainResult(model.eval(), losses, seconds)


def train_stacked(data: Tensor, loss: str, seeds, *, steps: int = 2000, batch_size: int = 256,
                  lr: float = 2e-3, head: str = "velocity", hidden: int = 128, depth: int = 3,
                  boundary_ratio: float | None = None, checkpoints=(),
                  callback: Callable | None = None) -> TrainResult:
    """Train one :class:`StackedFlowMapNet` unit per row of ``data`` (shape (units, n, dim)).

    Every unit gets its own initialisation (``seeds[i]``), its own mini-batches and prior draws
    (from one generator seeded with ``seeds[0] + 7919``), and the same optimizer as :func:`train`
    (Adam, cosine decay). The objective is the sum over units of each unit's loss, so the units
    train independently. ``callback(step, model)`` runs after each step listed in
    ``checkpoints`` (1-based step counts), e.g. to record an MMD-against-steps curve.
    ``losses`` in the result is the mean loss over units at each step.
    """
    import time

    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; choose one of {', '.join(LOSSES)}")
    if not isinstance(data, Tensor) or data.ndim != 3:
        raise ValueError("data must be a tensor of shape (units, n, dim)")
    check_on_sphere(data, "data")
    seeds = list(seeds)
    if len(seeds) != data.shape[0]:
        raise ValueError(f"need one seed per unit: {data.shape[0]} units, {len(seeds)} seeds")
    steps, batch_size = check_count(steps, "steps", 1), check_count(batch_size, "batch_size", 1)
    check_positive(lr, "lr")
    units, n, dim = data.shape
    model = StackedFlowMapNet(seeds, hidden=hidden, depth=depth, head=head, dim=dim)
    generator = torch.Generator().manual_seed(seeds[0] + 7919)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    objective = LOSSES[loss]
    times, ratio = TIME_SETTINGS[loss]
    if boundary_ratio is not None and loss != "rfm":
        ratio = boundary_ratio
    checkpoints = set(checkpoints)
    offsets = (torch.arange(units) * n)[:, None]
    flat = data.reshape(units * n, dim)
    losses = np.empty(steps)
    elapsed = 0.0
    for step in range(steps):
        start = time.perf_counter()
        idx = (torch.randint(0, n, (units, batch_size), generator=generator) + offsets).flatten()
        batch = make_batch(flat[idx], generator, boundary_ratio=ratio, times=times)
        batch = Batch(*(f.reshape(units, batch_size, *f.shape[1:]) for f in
                        (batch.x0, batch.x1, batch.xt, batch.v, batch.t, batch.s, batch.r,
                         batch.t_fm, batch.xt_fm, batch.v_fm)))
        per_unit = objective(model, batch) * units
        optimizer.zero_grad()
        per_unit.backward()
        optimizer.step()
        schedule.step()
        elapsed += time.perf_counter() - start
        losses[step] = float(per_unit.item()) / units
        if callback is not None and step + 1 in checkpoints:
            model.eval()
            callback(step + 1, model)
            model.train()
    if not np.all(np.isfinite(losses)):
        raise FloatingPointError(f"training with {loss} produced a non-finite loss")
    return TrainResult(model.eval(), losses, elapsed / steps)


# --- Sampling --------------------------------------------------------------------------------


def _grid(steps: int) -> list[float]:
    steps = check_count(steps, "steps", 1)
    return [k / steps for k in range(steps + 1)]


@torch.no_grad()
def sample_flow_map(model: FlowMapNet, x0: Tensor, steps: int) -> Tensor:
    """RMF sampler: x <- X_{t_k, t_{k+1}}(x) on a uniform grid of ``steps`` intervals (NFE)."""
    check_on_sphere(x0, "x0")
    grid = _grid(steps)
    x = x0
    for t, s in zip(grid[:-1], grid[1:], strict=True):
        x = model._flow_map(x, t, s)
    return x


@torch.no_grad()
def sample_euler(model: FlowMapNet, x0: Tensor, steps: int) -> Tensor:
    """RFM sampler: exp-map Euler x <- exp_x(dt v_t(x)), ``steps`` steps (NFE = steps)."""
    check_on_sphere(x0, "x0")
    grid = _grid(steps)
    x = x0
    for t, s in zip(grid[:-1], grid[1:], strict=True):
        x = _exp(x, (s - t) * model.velocity(x, t))
    return x


def sample_guided(model: FlowMapNet, x0: Tensor, steps: int, reward: Callable[[Tensor], Tensor],
                  scale: float, mode: str = "lookahead", match_norm: bool = False) -> Tensor:
    """Reward-guided flow-map sampling ({eq}`eq-rmf-guidance`).

    At each step t -> s: ``g = P_x grad_x R(X_{t,1}(x))`` (``mode="lookahead"``: the reward of the
    one-jump prediction of the endpoint) or ``g = P_x grad R(x)`` (``mode="current"``), then
    ``x <- exp_x((s - t)(u_{t,s}(x) + scale g))``. ``scale = 0`` or ``mode="none"`` is the
    unguided sampler. Look-ahead costs one extra network evaluation and one backward pass per step.
    ``match_norm=True`` (look-ahead only) rescales each look-ahead vector to the norm of the
    current-state vector at the same point, so that the two modes differ in direction only.
    """
    if mode not in ("lookahead", "current", "none"):
        raise ValueError(f"mode must be 'lookahead', 'current' or 'none', got {mode!r}")
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale):
        raise TypeError(f"scale must be a finite number, got {scale!r}")
    check_on_sphere(x0, "x0")
    grid = _grid(steps)
    x = x0.detach()
    for t, s in zip(grid[:-1], grid[1:], strict=True):
        if mode == "none" or scale == 0:
            g = torch.zeros_like(x)
        else:
            xg = x.detach().requires_grad_(True)
            point = model._flow_map(xg, t, 1.0) if mode == "lookahead" else xg
            (grad,) = torch.autograd.grad(reward(point).sum(), xg)
            g = proju(x, grad)
            if match_norm and mode == "lookahead":
                xc = x.detach().requires_grad_(True)
                (grad_now,) = torch.autograd.grad(reward(xc).sum(), xc)
                target = proju(x, grad_now).norm(dim=-1, keepdim=True)
                g = g * target / g.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        with torch.no_grad():
            u = model.average_velocity(x, t, s)
            x = _exp(x, (s - t) * (u + scale * g))
    return x.detach()


# --- Evaluation helpers ----------------------------------------------------------------------


def mmd_by_steps(model: FlowMapNet, x0: Tensor, reference: Tensor, steps: tuple[int, ...],
                 sampler: str = "flow_map", h: float = 0.2) -> dict[int, float]:
    """MMD between ``sampler`` outputs from ``x0`` and ``reference`` for each number of steps."""
    samplers = {"flow_map": sample_flow_map, "euler": sample_euler}
    if sampler not in samplers:
        raise ValueError(f"sampler must be one of {', '.join(samplers)}, got {sampler!r}")
    return {n: mmd(samplers[sampler](model, x0, n), reference, h) for n in steps}


def orthographic(x: Tensor, view=(1.0, 0.6, 0.8)) -> tuple[np.ndarray, np.ndarray]:
    """Orthographic projection of points on S^2 seen from direction ``view``.

    Returns the 2-D coordinates and a mask of the points on the visible (front) hemisphere.
    """
    check_on_sphere(x)
    if x.shape[-1] != 3:
        raise ValueError("orthographic projections are for points on S^2 (shape (n, 3))")
    w = torch.tensor(view, dtype=torch.float64)
    w = w / w.norm()
    up = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    e1 = torch.linalg.cross(up, w)
    e1 = e1 / e1.norm()
    e2 = torch.linalg.cross(w, e1)
    xd = x.detach().to(torch.float64)
    return torch.stack([xd @ e1, xd @ e2], -1).numpy(), (xd @ w > 0).numpy()
