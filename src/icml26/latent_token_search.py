"""Motion planning by search over hierarchically ordered discrete tokens.

Chapter ``latent-token-search`` of the book. The module has five parts.

* **Road world**: a kinematic bicycle model (:func:`bicycle_step`), the intelligent driver model
  (:func:`idm_acceleration`) and :func:`generate_futures`, which drives many egos at once with
  random manoeuvre primitives behind IDM lead vehicles and returns their short futures.
* **Quantiser**: :class:`FSQ`, finite scalar quantisation {eq}`eq-lts-fsq` with a
  straight-through gradient, checked against ``vector_quantize_pytorch.FSQ`` in the tests.
* **Models**: :class:`Tokenizer` (K FSQ tokens, a learned mask token, the masked decoder
  {eq}`eq-lts-masked-decoder`), trained with or without nested dropout {eq}`eq-lts-nested`
  by :func:`train_tokenizer`; :class:`TrajectoryVAE`, a continuous VAE; :class:`TokenPrior`,
  per-position token frequencies.
* **Objective**: :class:`Scenario` (goal, obstacle, optional moving agent) and
  :func:`task_cost` {eq}`eq-lts-objective`; :func:`realism_limits` and :func:`unrealistic`.
* **Search**: :func:`beam_search` over token prefixes, :func:`best_of_n`, :func:`cem_vae` and
  :func:`optimise_waypoints`, each returning the number of objective evaluations it spent
  ({eq}`eq-lts-costs`), and :func:`closed_loop`, which replans every few steps with a reactive
  IDM agent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from icml26.core import check_count

DT = 0.25
"""Time step of the road world, in seconds."""
HORIZON = 16
"""Number of future steps in one trajectory (4 s)."""
LANE = 3.5
"""Lane width in metres."""
WHEELBASE = 2.7
"""Wheelbase of the kinematic bicycle, in metres."""
PRIMITIVES = ("keep lane", "change left", "change right", "accelerate", "brake", "turn left",
              "turn right")
"""Manoeuvre primitives of :func:`generate_futures`, in the order of their integer labels."""


# --- Road world ------------------------------------------------------------------------------


def idm_acceleration(speed, gap, approach, desired_speed, max_accel=1.5, comfort_brake=2.0,
                     min_gap=2.0, headway=1.5):
    """Intelligent driver model: acceleration from speed, gap to the leader and approach rate.

    ``approach`` is own speed minus the leader's; ``gap = inf`` means a free road.
    """
    speed = np.asarray(speed, dtype=float)
    desired = min_gap + np.maximum(
        0.0, speed * headway + speed * approach / (2 * np.sqrt(max_accel * comfort_brake)))
    interaction = np.where(np.isfinite(gap), (desired / np.maximum(gap, 0.1)) ** 2, 0.0)
    return max_accel * (1 - (speed / desired_speed) ** 4 - interaction)


def bicycle_step(state: np.ndarray, accel, steer, dt: float = DT) -> np.ndarray:
    """One Euler step of the kinematic bicycle; ``state[..., :] = (x, y, heading, speed)``."""
    x, y, psi, v = np.moveaxis(np.asarray(state, dtype=float), -1, 0)
    x = x + v * np.cos(psi) * dt
    y = y + v * np.sin(psi) * dt
    psi = psi + v / WHEELBASE * np.tan(steer) * dt
    v = np.maximum(v + accel * dt, 0.0)
    return np.stack([x, y, psi, v], axis=-1)


def generate_futures(n: int, rng: np.random.Generator, horizon: int = HORIZON) -> dict:
    """``n`` ego futures in the ego frame, all simulated at once.

    Each ego starts at the origin heading along +x with speed ``U(4, 16)`` m/s and follows one
    primitive of :data:`PRIMITIVES`: a lateral controller to a target lane (keep, change left or
    right), free-road IDM with a higher desired speed (accelerate), a constant deceleration
    (brake) or a constant steering angle (turn). In the lane primitives the ego's speed follows
    IDM behind a lead vehicle that itself drives by IDM on a free road. Steering rate and jerk
    are limited as in a real car. Returns positions ``(n, horizon, 2)`` (the start excluded),
    initial speeds ``(n,)`` and primitive labels ``(n,)``.
    """
    n = check_count(n, "n", 1)
    horizon = check_count(horizon, "horizon", 4)
    speed0 = rng.uniform(4.0, 16.0, n)
    kind = rng.integers(0, len(PRIMITIVES), n)
    target_y = np.select([kind == 1, kind == 2], [LANE, -LANE], 0.0)
    gain = rng.uniform(0.3, 0.8, n)
    desired = np.where(kind == 3, speed0 + rng.uniform(3, 6, n), speed0 + rng.uniform(-1, 2, n))
    brake = rng.uniform(1.0, 4.0, n)
    turn = rng.uniform(0.04, 0.12, n) * np.where(kind == 5, 1.0, -1.0)
    lead = np.stack([rng.uniform(15, 60, n), rng.uniform(-3, 3, n) + speed0], axis=-1)
    lead_desired = lead[:, 1] + rng.uniform(-2, 2, n)
    has_lead = np.isin(kind, (0, 1, 2)) & (rng.random(n) < 0.6)
    state = np.stack([np.zeros(n), np.zeros(n), np.zeros(n), speed0], axis=-1)
    accel_prev, steer_prev = np.zeros(n), np.zeros(n)
    out = np.empty((n, horizon, 2))
    for t in range(horizon):
        x, y, psi, v = state.T
        gap = np.where(has_lead & (np.abs(y) < LANE / 2), lead[:, 0] - x - 4.5, np.inf)
        accel = idm_acceleration(v, gap, v - lead[:, 1], np.maximum(desired, 1.0),
                                 max_accel=np.where(kind == 3, 2.5, 1.5))
        accel = np.where(kind == 4, -brake, accel) + rng.normal(0, 0.15, n)
        heading_ref = np.arctan(gain * (target_y - y) / np.maximum(v, 1.0))
        steer = np.clip(1.5 * (heading_ref - psi), -0.4, 0.4)
        steer = np.where(kind >= 5, turn, steer)
        accel = np.clip(accel, accel_prev - 3.0 * DT, accel_prev + 3.0 * DT)  # jerk limit
        steer = np.clip(steer, steer_prev - 0.05, steer_prev + 0.05)  # steering-rate limit
        state = bicycle_step(state, accel, steer)
        lead_accel = idm_acceleration(lead[:, 1], np.inf, 0.0, np.maximum(lead_desired, 1.0))
        lead = np.stack([lead[:, 0] + lead[:, 1] * DT,
                         np.maximum(lead[:, 1] + lead_accel * DT, 0.0)], axis=-1)
        accel_prev, steer_prev = accel, steer
        out[:, t] = state[:, :2]
    return {"positions": out.astype(np.float32), "speed": speed0.astype(np.float32),
            "primitive": kind}


# --- Finite scalar quantisation ----------------------------------------------------------------


class FSQ(nn.Module):
    """Finite scalar quantisation {eq}`eq-lts-fsq` of the last axis, straight-through gradient.

    Channel ``i`` is bounded by ``tanh`` to ``L_i`` integer levels (shifted by one half when
    ``L_i`` is even), rounded, and divided by ``L_i // 2``, so codes lie in ``[-1, 1]``. The
    constants follow ``vector_quantize_pytorch.FSQ`` (its ``eps = 1e-3`` included).
    """

    def __init__(self, levels: Sequence[int]):
        super().__init__()
        levels = [check_count(level, "each level", 3) for level in levels]
        if not levels:
            raise ValueError("levels must not be empty")
        self.levels = tuple(levels)
        lv = torch.tensor(levels, dtype=torch.float32)
        self.register_buffer("_levels", lv, persistent=False)
        basis = torch.cumprod(torch.tensor([1] + levels[:-1], dtype=torch.float32), 0)
        self.register_buffer("_basis", basis, persistent=False)

    @property
    def dim(self) -> int:
        return len(self.levels)

    @property
    def codebook_size(self) -> int:
        return int(np.prod(self.levels))

    def forward(self, z: Tensor) -> Tensor:
        if z.shape[-1] != self.dim:
            raise ValueError(f"last axis must have {self.dim} channels, got {z.shape[-1]}")
        half_l = (self._levels - 1) * (1 + 1e-3) / 2
        offset = torch.where(self._levels % 2 == 0, 0.5, 0.0)
        shift = torch.atanh(offset / half_l)
        bounded = torch.tanh(z + shift) * half_l - offset
        rounded = bounded + (bounded.round() - bounded).detach()  # straight-through
        return rounded / torch.div(self._levels, 2, rounding_mode="floor")

    def codes_to_indices(self, codes: Tensor) -> Tensor:
        """Integer index of each code in ``[0, prod(levels))`` (mixed radix)."""
        half = torch.div(self._levels, 2, rounding_mode="floor")
        return ((codes * half + half) * self._basis).sum(-1).round().long()

    def indices_to_codes(self, indices: Tensor) -> Tensor:
        """Inverse of :meth:`codes_to_indices`."""
        indices = torch.as_tensor(indices)
        if indices.min() < 0 or indices.max() >= self.codebook_size:
            raise ValueError(f"indices must lie in [0, {self.codebook_size})")
        digits = torch.remainder(torch.div(indices.unsqueeze(-1), self._basis.long(),
                                           rounding_mode="floor"), self._levels.long())
        half = torch.div(self._levels, 2, rounding_mode="floor")
        return (digits.float() - half) / half

    def all_codes(self) -> Tensor:
        """Every code of the codebook, ``(prod(levels), dim)``, in index order."""
        return self.indices_to_codes(torch.arange(self.codebook_size))


# --- Models ----------------------------------------------------------------------------------


def _mlp(inputs: int, hidden: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inputs, hidden), nn.GELU(), nn.Linear(hidden, hidden),
                         nn.GELU(), nn.Linear(hidden, outputs))


ACCEL_SCALE = 2.0
"""m/s^2 of longitudinal acceleration per unit of decoder output."""
CURVATURE_SCALE = 0.05
"""1/m of path curvature per unit of decoder output."""


def rollout(controls: Tensor, speed) -> Tensor:
    """Integrate decoder outputs ``(n, T, 2)`` (scaled acceleration and path curvature) from the
    start state (origin, heading +x, ``speed``) into positions ``(n, T, 2)``
    ({eq}`eq-lts-masked-decoder`): a unicycle, so every decode is a drivable path."""
    n = len(controls)
    speed = torch.as_tensor(speed, dtype=controls.dtype).reshape(-1).expand(n)
    accel = ACCEL_SCALE * controls[..., 0]
    v = (speed.unsqueeze(1) + torch.cumsum(accel, 1) * DT).clamp_min(0.0)
    heading = torch.cumsum(v * CURVATURE_SCALE * controls[..., 1] * DT, 1)
    return torch.cumsum(torch.stack([v * torch.cos(heading), v * torch.sin(heading)], -1) * DT,
                        1)


class _Normaliser(nn.Module):
    def __init__(self, positions: Tensor, speed: Tensor):
        super().__init__()
        flat = positions.reshape(len(positions), -1)
        self.register_buffer("mean", flat.mean(0))
        self.register_buffer("std", flat.std(0) + 1e-3)
        self.register_buffer("speed_mean", speed.mean())
        self.register_buffer("speed_std", speed.std())

    def encode(self, positions: Tensor) -> Tensor:
        return (positions.reshape(len(positions), -1) - self.mean) / self.std

    def decode(self, flat: Tensor) -> Tensor:
        return (flat * self.std + self.mean).reshape(len(flat), -1, 2)

    def context(self, speed) -> Tensor:
        speed = torch.as_tensor(speed, dtype=torch.float32).reshape(-1, 1)
        return (speed - self.speed_mean) / self.speed_std


class Tokenizer(nn.Module):
    """An MLP autoencoder with ``n_tokens`` FSQ tokens and a masked decoder.

    :meth:`decode` keeps the first ``prefix`` tokens and replaces the rest by the learned mask
    token ({eq}`eq-lts-masked-decoder`). The mask starts at the zero code; without nested
    dropout it never receives a gradient, so an unordered tokenizer fills missing tokens with
    the centre of the codebook.
    """

    def __init__(self, positions: Tensor, speed: Tensor, n_tokens: int = 6,
                 levels: Sequence[int] = (8, 5, 5), hidden: int = 256):
        super().__init__()
        self.n_tokens = check_count(n_tokens, "n_tokens", 1)
        self.fsq = FSQ(levels)
        self.norm = _Normaliser(positions, speed)
        width = positions.shape[1] * 2
        self.encoder = _mlp(width + 1, hidden, self.n_tokens * self.fsq.dim)
        self.decoder = _mlp(self.n_tokens * self.fsq.dim + 1, hidden, width)
        self.mask = nn.Parameter(torch.zeros(self.n_tokens, self.fsq.dim))

    def check_prefix(self, prefix: int) -> int:
        prefix = check_count(prefix, "prefix length", 1)
        if prefix > self.n_tokens:
            raise ValueError(f"prefix length must lie in 1..{self.n_tokens}, got {prefix}")
        return prefix

    def encode(self, positions: Tensor, speed) -> Tensor:
        """Codes ``(n, K, q)`` of positions ``(n, T, 2)`` at initial speeds ``speed``."""
        x = torch.cat([self.norm.encode(positions), self.norm.context(speed)], -1)
        return self.fsq(self.encoder(x).reshape(len(x), self.n_tokens, self.fsq.dim))

    def decode_normalised(self, codes: Tensor, speed, prefix) -> Tensor:
        """Masked decode {eq}`eq-lts-masked-decoder` in standardised coordinates.

        ``prefix`` is one length or one per row; tokens at positions ``>= prefix`` are replaced by
        the learned mask, the decoder's controls are integrated by :func:`rollout`.
        """
        n = len(codes)
        prefix = torch.as_tensor(prefix).reshape(-1, 1, 1)
        keep = torch.arange(self.n_tokens).reshape(1, -1, 1) < prefix
        filled = torch.where(keep, codes, self.mask.expand(n, -1, -1))
        speed = torch.as_tensor(speed, dtype=torch.float32).reshape(-1).expand(n)
        out = self.decoder(torch.cat([filled.reshape(n, -1), self.norm.context(speed)], -1))
        return self.norm.encode(rollout(out.reshape(n, -1, 2), speed))

    def decode(self, codes: Tensor, speed, prefix: int | None = None) -> Tensor:
        """Positions ``(n, T, 2)`` from the first ``prefix`` tokens of ``codes`` ``(n, k>=prefix,
        q)``; missing tokens are masked ({eq}`eq-lts-masked-decoder`)."""
        prefix = self.n_tokens if prefix is None else self.check_prefix(prefix)
        if codes.shape[1] < self.n_tokens:
            pad = codes.new_zeros(len(codes), self.n_tokens - codes.shape[1], self.fsq.dim)
            codes = torch.cat([codes, pad], 1)
        return self.norm.decode(self.decode_normalised(codes, speed, prefix))

    def decode_indices(self, indices: Tensor, speed) -> Tensor:
        """Decode token indices ``(n, k)``: the prefix of length ``k``."""
        return self.decode(self.fsq.indices_to_codes(indices), speed, indices.shape[1])

    def decode_known(self, indices, known, speed) -> Tensor:
        """Positions ``(n, T, 2)`` from token indices ``(n, K)`` of which only the positions where
        ``known`` ``(n, K)`` is true are used; every other position gets its learned mask
        ({eq}`eq-lts-masked-decoder` with an arbitrary set of kept positions, not only a prefix).
        """
        indices = torch.as_tensor(indices, dtype=torch.long)
        known = torch.as_tensor(known, dtype=torch.bool)
        if indices.ndim != 2 or indices.shape[1] != self.n_tokens or known.shape != indices.shape:
            raise ValueError(f"indices and known must both have shape (n, {self.n_tokens}), got "
                             f"{tuple(indices.shape)} and {tuple(known.shape)}")
        codes = self.fsq.indices_to_codes(indices.clamp(0, self.fsq.codebook_size - 1))
        n = len(codes)
        filled = torch.where(known.unsqueeze(-1), codes, self.mask.expand(n, -1, -1))
        speed = torch.as_tensor(speed, dtype=torch.float32).reshape(-1).expand(n)
        out = self.decoder(torch.cat([filled.reshape(n, -1), self.norm.context(speed)], -1))
        return rollout(out.reshape(n, -1, 2), speed)

    def prefix_mse(self, positions: Tensor, speed, prefix: int) -> Tensor:
        """Per-trajectory mean squared error (m^2) of the decode from the first ``prefix``
        tokens."""
        with torch.no_grad():
            recon = self.decode(self.encode(positions, speed), speed, prefix)
        return ((recon - positions) ** 2).mean(dim=(1, 2))


class TrajectoryVAE(nn.Module):
    """A continuous VAE with a ``latent``-dimensional Gaussian latent and the same MLP sizes."""

    def __init__(self, positions: Tensor, speed: Tensor, latent: int = 8, hidden: int = 256):
        super().__init__()
        self.latent = check_count(latent, "latent", 1)
        self.norm = _Normaliser(positions, speed)
        width = positions.shape[1] * 2
        self.encoder = _mlp(width + 1, hidden, 2 * self.latent)
        self.decoder = _mlp(self.latent + 1, hidden, width)

    def decode(self, z: Tensor, speed) -> Tensor:
        speed = torch.as_tensor(speed, dtype=torch.float32).reshape(-1).expand(len(z))
        out = self.decoder(torch.cat([z, self.norm.context(speed)], -1))
        return rollout(out.reshape(len(z), -1, 2), speed)

    def loss(self, positions: Tensor, speed, noise_std: float = 0.1) -> Tensor:
        x = self.norm.encode(positions)
        stats = self.encoder(torch.cat([x, self.norm.context(speed)], -1))
        mu, logvar = stats.chunk(2, -1)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        speed_t = torch.as_tensor(speed, dtype=torch.float32)
        recon = self.norm.encode(self.decode(z, speed_t))
        nll = ((recon - x) ** 2).sum(-1) / (2 * noise_std**2)
        kl = 0.5 * (mu**2 + logvar.exp() - 1 - logvar).sum(-1)
        return (nll + kl).mean() / x.shape[1]


def train_tokenizer(positions, speed, *, nested: bool, steps: int = 1500, batch: int = 256,
                    lr: float = 2e-3, seed: int = 0, model: nn.Module | None = None,
                    **model_kwargs) -> nn.Module:
    """Train a :class:`Tokenizer` (or a :class:`TrajectoryVAE` passed as ``model``).

    With ``nested=True`` each example keeps a prefix of ``kappa ~ U{1..K}`` tokens
    ({eq}`eq-lts-nested`); with ``nested=False`` the decoder always sees all ``K``. Adam with a
    cosine learning-rate decay; the same steps, batch and data for every model.
    """
    steps = check_count(steps, "steps", 1)
    positions = torch.as_tensor(positions, dtype=torch.float32)
    speed = torch.as_tensor(speed, dtype=torch.float32)
    gen = torch.Generator().manual_seed(int(seed))
    torch.manual_seed(int(seed))
    if model is None:
        model = Tokenizer(positions, speed, **model_kwargs)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    for _ in range(steps):
        idx = torch.randint(0, len(positions), (batch,), generator=gen)
        x, v = positions[idx], speed[idx]
        if isinstance(model, TrajectoryVAE):
            loss = model.loss(x, v)
        else:
            k = model.n_tokens
            prefix = (torch.randint(1, k + 1, (batch,), generator=gen) if nested
                      else torch.full((batch,), k))
            codes = model.encode(x, v)
            loss = ((model.decode_normalised(codes, v, prefix) - model.norm.encode(x)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    model.eval()
    return model


class TokenPrior:
    """Per-position token frequencies with add-one smoothing, fitted on training codes."""

    def __init__(self, tokenizer: Tokenizer, positions, speed):
        with torch.no_grad():
            codes = tokenizer.encode(torch.as_tensor(positions), torch.as_tensor(speed))
        idx = tokenizer.fsq.codes_to_indices(codes)
        size = tokenizer.fsq.codebook_size
        counts = torch.stack([torch.bincount(idx[:, k], minlength=size)
                              for k in range(tokenizer.n_tokens)]).float() + 1.0
        self.log_prob = (counts / counts.sum(1, keepdim=True)).log()

    def nll(self, indices: Tensor) -> Tensor:
        """Negative log prior of each prefix ``(n, k)``."""
        k = indices.shape[1]
        return -self.log_prob[torch.arange(k), indices].sum(-1)

    def sample(self, n: int, generator: torch.Generator) -> Tensor:
        probs = self.log_prob.exp()
        return torch.stack([torch.multinomial(p, n, replacement=True, generator=generator)
                            for p in probs], -1)


class JointPrior:
    """The empirical joint law of training code tuples, read in a search ``order``.

    The tuples of the training set are stored with their positions permuted by ``order`` and
    sorted lexicographically, so that the rows sharing a prefix are contiguous. The conditional
    law of the next token given a prefix ``(z_{o_1}, ..., z_{o_k})`` is the frequency of the
    next token among the training tuples that share the prefix, smoothed towards the marginal of
    that position with weight ``smoothing`` {eq}`eq-lts-joint-prior`. ``order`` defaults to the
    token order (coarse to fine); ``order[::-1]`` searches fine to coarse.
    """

    def __init__(self, tokenizer: Tokenizer, positions, speed, order: Sequence[int] | None = None,
                 smoothing: float = 1.0):
        k_all, size = tokenizer.n_tokens, tokenizer.fsq.codebook_size
        order = list(range(k_all)) if order is None else [int(o) for o in order]
        if sorted(order) != list(range(k_all)):
            raise ValueError(f"order must be a permutation of 0..{k_all - 1}, got {order}")
        if not smoothing > 0:
            raise ValueError(f"smoothing must be positive, got {smoothing}")
        with torch.no_grad():
            codes = tokenizer.encode(torch.as_tensor(positions), torch.as_tensor(speed))
        raw = tokenizer.fsq.codes_to_indices(codes).numpy().astype(np.int64)
        self.order, self.size, self.n_tokens = np.array(order), size, k_all
        self.smoothing = float(smoothing)
        tuples = raw[:, self.order]
        perm = np.lexsort(tuples.T[::-1])
        self.tuples = tuples[perm]  # search order, sorted
        self.keys = [self._key(self.tuples[:, :k]) for k in range(k_all + 1)]
        counts = np.stack([np.bincount(self.tuples[:, k], minlength=size)
                           for k in range(k_all)]).astype(float) + 1.0
        self.marginal = counts / counts.sum(1, keepdims=True)

    def _key(self, prefixes: np.ndarray) -> np.ndarray:
        k = prefixes.shape[1]
        return (prefixes * self.size ** np.arange(k - 1, -1, -1, dtype=np.int64)).sum(1)

    def _counts(self, prefixes: np.ndarray) -> np.ndarray:
        """Number of training tuples that share each prefix (search order)."""
        keys, k = self._key(prefixes), prefixes.shape[1]
        return (np.searchsorted(self.keys[k], keys, "right")
                - np.searchsorted(self.keys[k], keys, "left"))

    def conditional(self, prefixes) -> np.ndarray:
        """Probabilities ``(n, C)`` of the next token in search order after each prefix."""
        prefixes = np.asarray(prefixes, dtype=np.int64)
        if prefixes.ndim != 2:
            raise ValueError(f"prefixes must have shape (n, k), got {prefixes.shape}")
        k = prefixes.shape[1]
        if k >= self.n_tokens:
            raise ValueError(f"a prefix of length {k} has no next token")
        keys = self._key(prefixes)
        lo = np.searchsorted(self.keys[k], keys, "left")
        hi = np.searchsorted(self.keys[k], keys, "right")
        out = np.empty((len(prefixes), self.size))
        for row, (a, b) in enumerate(zip(lo, hi, strict=True)):
            counts = np.bincount(self.tuples[a:b, k], minlength=self.size)
            out[row] = (counts + self.smoothing * self.marginal[k]) / (b - a + self.smoothing)
        return out

    def log_prob(self, prefixes) -> np.ndarray:
        """Log-probability of prefixes (search order) under the chain of conditionals."""
        prefixes = np.asarray(prefixes, dtype=np.int64)
        total = np.zeros(len(prefixes))
        below = np.full(len(prefixes), len(self.tuples))
        for k in range(prefixes.shape[1]):
            above = self._counts(prefixes[:, :k + 1])
            total += np.log((above + self.smoothing * self.marginal[k, prefixes[:, k]])
                            / (below + self.smoothing))
            below = above
        return total

    def to_positions(self, tuples: np.ndarray) -> np.ndarray:
        """Tuples in search order to tuples in token order."""
        out = np.empty_like(tuples)
        out[:, self.order] = tuples
        return out

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` training tuples drawn uniformly (the empirical joint law), in token order."""
        n = check_count(n, "n", 1)
        return self.to_positions(self.tuples[rng.integers(0, len(self.tuples), n)])

    def complete(self, prefixes, rng: np.random.Generator) -> np.ndarray:
        """Complete each prefix (search order) with the rest of a training tuple drawn uniformly
        among those that share the longest prefix present in the data; token order out."""
        prefixes = np.asarray(prefixes, dtype=np.int64)
        n, k = prefixes.shape
        rows = np.full(n, -1)
        for length in range(k, -1, -1):
            todo = np.flatnonzero(rows < 0)
            if not len(todo):
                break
            keys = self._key(prefixes[todo, :length])
            lo = np.searchsorted(self.keys[length], keys, "left")
            hi = np.searchsorted(self.keys[length], keys, "right")
            hit = hi > lo
            rows[todo[hit]] = lo[hit] + (rng.random(hit.sum()) * (hi - lo)[hit]).astype(int)
        out = self.tuples[rows].copy()
        out[:, :k] = prefixes
        return self.to_positions(out)


# --- Objective -------------------------------------------------------------------------------


@dataclass
class Scenario:
    """A planning problem in the ego frame (ego at the origin, heading +x, speed ``speed``).

    ``goal_index`` is the step at which the goal term is evaluated; ``agent`` is an optional
    predicted path ``(T, 2)`` of a moving vehicle. A goal inside the obstacle is rejected.
    """

    speed: float
    goal: tuple[float, float]
    obstacle: tuple[float, float]
    radius: float = 2.5
    goal_index: int = HORIZON - 1
    agent: np.ndarray | None = None
    agent_radius: float = 3.0

    def __post_init__(self):
        if not self.radius > 0:
            raise ValueError(f"radius must be positive, got {self.radius}")
        if math.dist(self.goal, self.obstacle) <= self.radius:
            raise ValueError(f"goal {self.goal} lies inside the obstacle at {self.obstacle} "
                             f"(radius {self.radius}): no plan can reach it safely")
        if not 0 <= self.goal_index < HORIZON:
            raise ValueError(f"goal_index must lie in 0..{HORIZON - 1}, got {self.goal_index}")


GOAL_SCALE = 2.0
"""Metres of goal error that cost one unit in {eq}`eq-lts-objective`."""
COLLISION_WEIGHT = 10.0
JERK_WEIGHT = 0.01


def _with_start(positions: Tensor, speed: float) -> Tensor:
    """Prepend the two implied past points (-v dt, 0) and (0, 0) to positions ``(n, T, 2)``."""
    n = len(positions)
    past = positions.new_tensor([[-float(speed) * DT, 0.0], [0.0, 0.0]]).expand(n, 2, 2)
    return torch.cat([past, positions], 1)


def jerk(positions: Tensor, speed: float) -> Tensor:
    """Jerk vectors (m/s^3) from third differences, continuous with the start state."""
    p = _with_start(positions, speed)
    return (p[:, 3:] - 3 * p[:, 2:-1] + 3 * p[:, 1:-2] - p[:, :-3]) / DT**3


def curvature(positions: Tensor, speed: float) -> Tensor:
    """Signed path curvature (1/m) from finite differences; zero below 1 m/s."""
    p = _with_start(positions, speed)
    vel = (p[:, 2:] - p[:, :-2]) / (2 * DT)
    acc = (p[:, 2:] - 2 * p[:, 1:-1] + p[:, :-2]) / DT**2
    cross = vel[..., 0] * acc[..., 1] - vel[..., 1] * acc[..., 0]
    sp = vel.norm(dim=-1)
    return torch.where(sp > 1.0, cross / sp.clamp_min(1.0) ** 3, torch.zeros_like(sp))


def task_cost(positions: Tensor, scenario: Scenario) -> Tensor:
    """Goal + collision + comfort cost {eq}`eq-lts-objective` of plans ``(n, T, 2)``."""
    if positions.ndim != 3 or positions.shape[1:] != (HORIZON, 2):
        raise ValueError(f"plans must have shape (n, {HORIZON}, 2), got {tuple(positions.shape)}")
    goal = positions.new_tensor(scenario.goal)
    goal_term = ((positions[:, scenario.goal_index] - goal) ** 2).sum(-1) / GOAL_SCALE**2
    dist = (positions - positions.new_tensor(scenario.obstacle)).norm(dim=-1)
    collision = (scenario.radius - dist).clamp_min(0).pow(2).sum(-1)
    if scenario.agent is not None:
        adist = (positions - positions.new_tensor(np.asarray(scenario.agent))).norm(dim=-1)
        collision = collision + (scenario.agent_radius - adist).clamp_min(0).pow(2).sum(-1)
    comfort = jerk(positions, scenario.speed).pow(2).sum(-1).mean(-1)
    return goal_term + COLLISION_WEIGHT * collision + JERK_WEIGHT * comfort


def realism_limits(positions, speed, quantile: float = 0.99) -> tuple[float, float]:
    """The data's limits: ``quantile`` of the per-trajectory max |curvature| and max |jerk|."""
    kappa, jk = _max_curv_jerk(torch.as_tensor(positions, dtype=torch.float32),
                               torch.as_tensor(speed, dtype=torch.float32))
    return float(torch.quantile(kappa, quantile)), float(torch.quantile(jk, quantile))


def _max_curv_jerk(positions: Tensor, speed: Tensor) -> tuple[Tensor, Tensor]:
    n = len(positions)
    past = torch.stack([-speed * DT, torch.zeros_like(speed)], -1).reshape(n, 1, 2)
    p = torch.cat([past, torch.zeros(n, 1, 2), positions], 1)
    vel = (p[:, 2:] - p[:, :-2]) / (2 * DT)
    acc = (p[:, 2:] - 2 * p[:, 1:-1] + p[:, :-2]) / DT**2
    cross = vel[..., 0] * acc[..., 1] - vel[..., 1] * acc[..., 0]
    sp = vel.norm(dim=-1)
    kappa = torch.where(sp > 1.0, cross / sp.clamp_min(1.0) ** 3, torch.zeros_like(sp))
    jk = ((p[:, 3:] - 3 * p[:, 2:-1] + 3 * p[:, 1:-2] - p[:, :-3]) / DT**3).norm(dim=-1)
    return kappa.abs().amax(1), jk.amax(1)


def unrealistic(positions: Tensor, speed: float, limits: tuple[float, float]) -> Tensor:
    """True for plans whose max |curvature| or max |jerk| exceeds the data's limits."""
    kappa, jk = _max_curv_jerk(positions, torch.full((len(positions),), float(speed)))
    return (kappa > limits[0]) | (jk > limits[1])


# --- Search ----------------------------------------------------------------------------------


@dataclass
class Plan:
    """A search result: the plan ``(T, 2)``, its task cost, and the evaluations spent."""

    positions: Tensor
    cost: float
    evaluations: int
    trace: list | None = None


def beam_cost(n_tokens: int, codebook: int, width: int) -> int:
    """Decoder evaluations of beam search {eq}`eq-lts-costs`: ``C (1 + (K - 1) B)``."""
    return codebook * (1 + (n_tokens - 1) * width)


def beam_width_for(budget: int, n_tokens: int, codebook: int) -> int:
    """The widest beam that fits in ``budget`` decoder evaluations; errors if none fits."""
    budget = check_count(budget, "budget", 1)
    if budget < codebook:
        raise ValueError(f"budget {budget} is smaller than one beam step ({codebook} decodes: "
                         "every code of one token position)")
    if n_tokens == 1:
        return 1  # a single step scores all C codes whatever the width
    width = (budget // codebook - 1) // (n_tokens - 1)
    if width < 1:
        raise ValueError(f"budget {budget} cannot finish even a width-1 beam "
                         f"({beam_cost(n_tokens, codebook, 1)} decodes)")
    return width


@torch.no_grad()
def beam_search(tokenizer: Tokenizer, scenario: Scenario, budget: int,
                prior: TokenPrior | None = None, prior_weight: float = 0.0) -> Plan:
    """Beam search over token prefixes, coarse to fine.

    At position ``k`` every kept prefix is extended by every code; each child is scored by the
    objective of its prefix decode (missing tokens masked) plus ``prior_weight`` times its
    negative log prior; the best ``B`` are kept. ``B`` is the widest beam within ``budget``,
    and the search spends ``C (1 + (K - 1) B)`` decoder evaluations {eq}`eq-lts-costs`; the
    returned cost is the objective {eq}`eq-lts-objective` without the prior.
    """
    codebook = tokenizer.fsq.codebook_size
    width = beam_width_for(budget, tokenizer.n_tokens, codebook)
    all_idx = torch.arange(codebook)
    beams = torch.zeros(1, 0, dtype=torch.long)
    evaluations = 0
    for _ in range(tokenizer.n_tokens):
        children = torch.cat([beams.repeat_interleave(codebook, 0),
                              all_idx.repeat(len(beams)).unsqueeze(1)], 1)
        plans = tokenizer.decode_indices(children, scenario.speed)
        score = task_cost(plans, scenario)
        evaluations += len(children)
        if prior is not None and prior_weight:
            score = score + prior_weight * prior.nll(children)
        order = score.argsort()[:width]
        beams, best_plans = children[order], plans[order]
    final = best_plans[0]
    return Plan(final, float(task_cost(final[None], scenario)[0]), evaluations)


@torch.no_grad()
def best_of_n(tokenizer: Tokenizer, scenario: Scenario, n: int, prior: TokenPrior,
              generator: torch.Generator, prior_weight: float = 0.0) -> Plan:
    """Sample ``n`` full token sequences from the prior, decode, keep the best."""
    n = check_count(n, "n", 1)
    idx = prior.sample(n, generator)
    plans = tokenizer.decode_indices(idx, scenario.speed)
    score = task_cost(plans, scenario) + prior_weight * prior.nll(idx)
    best = plans[score.argmin()]
    return Plan(best, float(task_cost(best[None], scenario)[0]), n)


@torch.no_grad()
def cem_vae(vae: TrajectoryVAE, scenario: Scenario, budget: int, generator: torch.Generator,
            population: int = 200, elite: float = 0.1, prior_weight: float = 0.0) -> Plan:
    """Cross-entropy method on the VAE latent: ``budget // population`` Gaussian refits."""
    budget = check_count(budget, "budget", 1)
    if budget < population:
        raise ValueError(f"budget {budget} is smaller than one CEM population ({population})")
    n_elite = max(2, int(elite * population))
    mean, std = torch.zeros(vae.latent), torch.ones(vae.latent)
    best, best_score, used = None, math.inf, 0
    for _ in range(budget // population):
        z = mean + std * torch.randn(population, vae.latent, generator=generator)
        plans = vae.decode(z, scenario.speed)
        score = task_cost(plans, scenario) + prior_weight * 0.5 * (z**2).sum(-1)
        used += population
        order = score.argsort()
        if score[order[0]] < best_score:
            best_score, best = float(score[order[0]]), plans[order[0]]
        elites = z[order[:n_elite]]
        mean, std = elites.mean(0), elites.std(0) + 0.05
    return Plan(best, float(task_cost(best[None], scenario)[0]), used)


def optimise_waypoints(scenario: Scenario, budget: int, generator: torch.Generator,
                       restarts: int = 8, lr: float = 0.3,
                       init_noise: tuple[float, float] = (1.0, 2.0)) -> Plan:
    """Adam directly on the ``T x 2`` waypoints, ``restarts`` in parallel, no learned model.

    Starts from the constant-velocity line plus Gaussian noise of standard deviation
    ``init_noise`` (longitudinal, lateral; ``(0, 0)`` with one restart is the noise-free start);
    every step evaluates the objective (with its gradient) once per restart, so
    ``budget // restarts`` steps.
    """
    budget = check_count(budget, "budget", 1)
    if budget < restarts:
        raise ValueError(f"budget {budget} is smaller than one step of {restarts} restarts")
    t = torch.arange(1, HORIZON + 1, dtype=torch.float32) * DT
    line = torch.stack([scenario.speed * t, torch.zeros_like(t)], -1)
    init = line + torch.randn(restarts, HORIZON, 2, generator=generator) * torch.tensor(
        [float(init_noise[0]), float(init_noise[1])])
    way = init.clone().requires_grad_(True)
    opt = torch.optim.Adam([way], lr=lr)
    steps = budget // restarts
    for _ in range(steps):
        loss = task_cost(way, scenario)
        opt.zero_grad()
        loss.sum().backward()
        opt.step()
    with torch.no_grad():
        cost = task_cost(way, scenario)
        best = way[cost.argmin()].detach()
    return Plan(best, float(cost.min()), steps * restarts)


def topm_cost(n_tokens: int, top_m: int, width: int) -> int:
    """Decoder evaluations of a beam that expands the top ``M`` codes {eq}`eq-lts-costs`:
    ``sum_k M min(B, M^k)`` over the steps ``k = 0..K-1`` (step ``k`` extends at most ``M^k``
    prefixes), which is ``M (1 + (K - 1) B)`` when ``M >= B``."""
    n_tokens, top_m = check_count(n_tokens, "n_tokens", 1), check_count(top_m, "top_m", 1)
    width = check_count(width, "width", 1)
    return sum(top_m * min(width, top_m**k) for k in range(n_tokens))


def topm_width_for(budget: int, n_tokens: int, top_m: int) -> int:
    """The widest beam of :func:`topm_cost` within ``budget`` (no wider than the number of
    prefixes the last step can have)."""
    budget, top_m = check_count(budget, "budget", 1), check_count(top_m, "top_m", 1)
    n_tokens = check_count(n_tokens, "n_tokens", 1)
    if topm_cost(n_tokens, top_m, 1) > budget:
        raise ValueError(f"budget {budget} cannot finish a width-1 beam expanding {top_m} codes "
                         f"({topm_cost(n_tokens, top_m, 1)} decodes)")
    if n_tokens == 1:
        return 1
    cap = top_m ** (n_tokens - 1)
    low, high = 1, min(cap, budget)  # the largest affordable width, by bisection
    while low < high:
        mid = (low + high + 1) // 2
        if topm_cost(n_tokens, top_m, mid) <= budget:
            low = mid
        else:
            high = mid - 1
    return low


@torch.no_grad()
def token_beam(tokenizer: Tokenizer, speed: float, cost_fn: Callable[[Tensor], Tensor],
               prior: JointPrior, width: int, top_m: int, *, score: str = "mask",
               prior_weight: float = 0.0, rng: np.random.Generator | None = None) -> Plan:
    """Beam search over tokens in the search order of ``prior``, expanding the top ``M`` codes.

    At step ``k`` each kept prefix (in the order ``prior.order``) is extended by the ``top_m``
    most probable next codes under the prior's conditional law {eq}`eq-lts-joint-prior`; each
    child is scored by ``cost_fn`` of one decode plus ``prior_weight`` times its negative log
    prior, and the best ``width`` are kept. ``score="mask"`` decodes the child with its unset
    tokens masked ({eq}`eq-lts-masked-decoder`); ``score="complete"`` decodes the child completed
    by a training tuple that shares it (:meth:`JointPrior.complete`, which needs ``rng``). The
    search spends :func:`topm_cost` decodes {eq}`eq-lts-costs`. ``trace`` holds, after each
    step, the evaluations spent so far and the objective of the best child's decode.
    """
    width, top_m = check_count(width, "width", 1), check_count(top_m, "top_m", 1)
    if score not in ("mask", "complete"):
        raise ValueError(f"score must be 'mask' or 'complete', got {score!r}")
    if score == "complete" and rng is None:
        raise ValueError("score='complete' draws completions: pass rng")
    if prior.n_tokens != tokenizer.n_tokens or prior.size != tokenizer.fsq.codebook_size:
        raise ValueError("the prior was fitted on another tokenizer's codes")
    k_all, m = tokenizer.n_tokens, min(top_m, prior.size)
    beams, beam_logp = np.zeros((1, 0), np.int64), np.zeros(1)
    evaluations, trace = 0, []
    for k in range(k_all):
        probs = prior.conditional(beams)
        top = np.argsort(-probs, axis=1, kind="stable")[:, :m]
        children = np.concatenate([np.repeat(beams, m, 0), top.reshape(-1, 1)], 1)
        logp = np.repeat(beam_logp, m) + np.log(np.take_along_axis(probs, top, 1)).ravel()
        if score == "mask" or k == k_all - 1:
            full = np.zeros((len(children), k_all), np.int64)
            full[:, prior.order[:k + 1]] = children
            known = np.zeros_like(full, dtype=bool)
            known[:, prior.order[:k + 1]] = True
            plans = tokenizer.decode_known(torch.from_numpy(full), torch.from_numpy(known), speed)
        else:
            full = prior.complete(children, rng)
            plans = tokenizer.decode_indices(torch.from_numpy(full), speed)
        cost = cost_fn(plans)
        evaluations += len(children)
        ranked = np.argsort((cost - prior_weight * torch.from_numpy(logp).float()).numpy(),
                            kind="stable")[:width]
        beams, beam_logp = children[ranked], logp[ranked]
        trace.append((evaluations, float(cost[ranked[0]])))
        best = plans[ranked[0]]
    return Plan(best, float(cost_fn(best[None])[0]), evaluations, trace)


@torch.no_grad()
def best_of_joint(tokenizer: Tokenizer, speed: float, cost_fn: Callable[[Tensor], Tensor],
                  prior: JointPrior, n: int, rng: np.random.Generator,
                  prior_weight: float = 0.0) -> Plan:
    """Best-of-N over ``n`` training code tuples drawn from the empirical joint law."""
    tuples = prior.sample(n, rng)
    plans = tokenizer.decode_indices(torch.from_numpy(tuples), speed)
    cost = cost_fn(plans)
    logp = prior.log_prob(tuples[:, prior.order])
    best = plans[int(np.argmin(cost.numpy() - prior_weight * logp))]
    return Plan(best, float(cost_fn(best[None])[0]), n)


@dataclass
class CutIn:
    """An adversarial cut-in: the *other* agent's plan, searched in the same token space.

    The ego drives at constant speed ``ego_speed`` along ``y = 0``; the agent starts at
    ``start`` (ego frame, heading +x) with speed ``speed`` and should end in the ego's lane
    ``gap`` metres ahead of the ego, without contact (``radius``) {eq}`eq-lts-cutin`.
    """

    ego_speed: float
    start: tuple[float, float]
    speed: float
    gap: float = 8.0
    radius: float = 3.0

    def ego_path(self) -> Tensor:
        t = torch.arange(1, HORIZON + 1, dtype=torch.float32) * DT
        return torch.stack([self.ego_speed * t, torch.zeros_like(t)], -1)

    def cost(self, positions: Tensor) -> Tensor:
        """Cut-in objective {eq}`eq-lts-cutin` of agent plans ``(n, T, 2)`` in the agent's frame."""
        world = positions + positions.new_tensor(self.start)
        ego = self.ego_path()
        target = ego[-1] + torch.tensor([self.gap, 0.0])
        goal_term = ((world[:, -1] - target) ** 2).sum(-1) / GOAL_SCALE**2
        dist = (world - ego).norm(dim=-1)
        contact = (self.radius - dist).clamp_min(0).pow(2).sum(-1)
        comfort = jerk(positions, self.speed).pow(2).sum(-1).mean(-1)
        return goal_term + COLLISION_WEIGHT * contact + JERK_WEIGHT * comfort

    def success(self, positions: Tensor) -> Tensor:
        """Ends in the ego's lane within 3 m of the target gap, never within ``radius``."""
        world = positions + positions.new_tensor(self.start)
        ego = self.ego_path()
        lateral = world[:, -1, 1].abs() < LANE / 2
        gap_ok = (world[:, -1, 0] - ego[-1, 0] - self.gap).abs() < 3.0
        clear = (world - ego).norm(dim=-1).amin(-1) > self.radius
        return lateral & gap_ok & clear


def make_cut_ins(n: int, rng: np.random.Generator) -> list[CutIn]:
    """``n`` cut-in problems: the agent starts in a neighbouring lane, 10 m behind to 5 m ahead
    of the ego, 1-4 m/s faster."""
    n = check_count(n, "n", 1)
    out = []
    for _ in range(n):
        ego = float(rng.uniform(8.0, 14.0))
        side = float(rng.choice([-1.0, 1.0]))
        out.append(CutIn(ego_speed=ego, start=(float(rng.uniform(-10.0, 5.0)), side * LANE),
                         speed=ego + float(rng.uniform(1.0, 4.0))))
    return out


# --- Closed loop -----------------------------------------------------------------------------


def _rotation(angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, -s], [s, c]])


def closed_loop(planner: Callable[[Scenario], Plan], speed: float, goal, obstacle,
                radius: float = 2.5, replan_every: int = 4, agent_gap: float = 12.0,
                agent_radius: float = 3.0) -> dict:
    """Replan every ``replan_every`` steps against a reactive IDM agent in the goal's lane.

    The world frame is the ego's start frame. The agent starts ``agent_gap`` metres behind the
    ego in the goal lane, 2 m/s faster, and follows IDM behind the ego once the ego is ahead of
    it in its lane. Each plan sees the agent as a constant-velocity prediction. Success: no
    contact with the obstacle or the agent, and the ego ends within 2 m of the goal.
    """
    replan_every = check_count(replan_every, "replan_every", 1)
    if HORIZON % replan_every:
        raise ValueError(f"replan_every must divide the horizon {HORIZON}")
    goal, obstacle = np.asarray(goal, float), np.asarray(obstacle, float)
    pos, heading, v = np.zeros(2), 0.0, float(speed)
    agent = np.array([-agent_gap, goal[1]])
    agent_v = speed + 2.0
    path, agent_path, collided = [], [], False
    for elapsed in range(0, HORIZON, replan_every):
        rot = _rotation(-heading)
        pred = agent + np.outer(np.arange(1, HORIZON + 1) * DT, [agent_v, 0.0])
        local = Scenario(speed=v, goal=tuple(rot @ (goal - pos)),
                         obstacle=tuple(rot @ (obstacle - pos)), radius=radius,
                         goal_index=HORIZON - 1 - elapsed, agent=(pred - pos) @ rot.T,
                         agent_radius=agent_radius)
        plan = planner(local).positions.detach().numpy().astype(float)
        world = plan @ _rotation(heading).T + pos
        for step in range(replan_every):
            prev = pos
            pos = world[step]
            ahead = abs(pos[1] - agent[1]) < LANE / 2 and pos[0] > agent[0]
            gap = pos[0] - agent[0] - 4.5 if ahead else np.inf
            ego_v = np.linalg.norm(pos - prev) / DT
            acc = float(idm_acceleration(agent_v, gap, agent_v - ego_v, speed + 3.0,
                                         comfort_brake=3.0))
            acc = max(acc, -8.0)
            agent = agent + np.array([agent_v * DT, 0.0])
            agent_v = max(agent_v + acc * DT, 0.0)
            collided |= bool(np.linalg.norm(pos - obstacle) < radius)
            collided |= bool(np.linalg.norm(pos - agent) < agent_radius)
            path.append(pos)
            agent_path.append(agent.copy())
        step_vec = world[replan_every - 1] - (world[replan_every - 2] if replan_every > 1
                                              else prev)
        heading = math.atan2(step_vec[1], step_vec[0])
        v = float(np.linalg.norm(step_vec) / DT)
    path = np.array(path)
    reached = bool(np.linalg.norm(path[-1] - goal) < 2.0)
    return {"path": path, "agent": np.array(agent_path), "collided": collided,
            "reached": reached, "success": reached and not collided}


def placebo_cost(key: int, scale: float = 100.0) -> Callable[[Tensor], Tensor]:
    """An objective that no prefix can predict: ``log J`` is a fresh standard normal per plan.

    ``log J(x) = Phi^{-1}(frac(<W, x>))`` with ``W`` a ``(T, 2)`` Gaussian matrix of scale
    ``scale`` per metre drawn from ``key``: plans that differ by a few centimetres get
    independent values, and a masked decode says nothing about the value of any completion.
    The same plan always gets the same value (the map is deterministic), and a new ``key`` gives
    an independent objective. It is the falsification control of the search order: with no
    information for the first tokens to reveal, searching coarse to fine cannot beat fine to
    coarse.
    """
    key = check_count(key, "key", 0)
    weights = torch.randn(HORIZON, 2, generator=torch.Generator().manual_seed(key),
                          dtype=torch.float64) * scale

    def cost(positions: Tensor) -> Tensor:
        h = (positions.double() * weights).sum((-2, -1))
        u = (h - torch.floor(h)).clamp(1e-9, 1 - 1e-9)
        return torch.exp(torch.special.ndtri(u)).float()

    return cost


def make_scenarios(n: int, rng: np.random.Generator) -> list[Scenario]:
    """``n`` held-out planning problems: a stopped car blocks the ego lane, the goal is in the
    next lane (left or right) about one horizon ahead."""
    n = check_count(n, "n", 1)
    out = []
    for _ in range(n):
        speed = float(rng.uniform(6.0, 14.0))
        reach = speed * HORIZON * DT * float(rng.uniform(0.85, 1.05))
        side = float(rng.choice([-1.0, 1.0]))
        goal = (reach, side * LANE + float(rng.normal(0, 0.2)))
        obstacle = (reach * float(rng.uniform(0.4, 0.65)), float(rng.normal(0, 0.3)))
        out.append(Scenario(speed=speed, goal=goal, obstacle=obstacle))
    return out


def quick_tokenizer(n: int = 3000, steps: int = 300, seed: int = 0, hidden: int = 64):
    """A small ordered tokenizer for exercises and checks: ``(tokenizer, prior, positions,
    speed)`` trained with nested dropout on ``n`` generated futures (about a second of CPU)."""
    data = generate_futures(n, np.random.default_rng(seed))
    positions, speed = torch.tensor(data["positions"]), torch.tensor(data["speed"])
    tokenizer = train_tokenizer(positions, speed, nested=True, steps=steps, seed=seed,
                                hidden=hidden)
    return tokenizer, TokenPrior(tokenizer, positions, speed), positions, speed
