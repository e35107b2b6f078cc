"""Hyperspherical parameter sharing (HPS) for cooperative multi-agent policy gradients.

Everything here is a CPU-scale reconstruction of the mechanism described in the abstract of
*HPS: Hyperspherical Parameter Sharing for Efficient Multi-Agent Reinforcement Learning*
(ICML 2026); the layer, the scale generator, the environment and the statistics are ours.

* :class:`GainReach` is a vectorised cooperative task (torch): every agent must move to its own
  goal, all agents want the same *direction* of action, but hidden actuator gains make the right
  *scale* differ between agents (eq-hps-oracle). :class:`GainReachParallelEnv` wraps one copy of
  it in PettingZoo's parallel API. :class:`Spread` is MPE's ``simple_spread`` (mpe2's
  ``simple_spread_v3``, continuous actions, optional per-agent action scales) re-implemented in
  torch for many seeds at once; :func:`mpe2_spread` builds the original with the same scales.
* :class:`AgentPolicy` is one Gaussian MLP policy for all agents, in six sharing modes
  (:data:`METHODS`): no sharing, full sharing, sharing with agent IDs, HPS (eq-hps-layer),
  Euclidean shared weights with agent scales, and sphere weights with shared scales. Every mode,
  every agent and every seed lives in one batched tensor, so one training loop trains ``S``
  independent seeds at once.
* :func:`train` is REINFORCE with a per-step batch-mean baseline (eq-hps-reinforce); sphere rows
  are optimised with geoopt's Riemannian Adam, everything else with Adam.
* :func:`decompose` and :func:`ggda` split each agent's gradient on a weight row into its radial
  and tangential parts (eq-hps-decompose) and measure the agreement between agents.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import geoopt
import numpy as np
import torch
from torch import nn

METHODS = ("nops", "fups", "fups_id", "hps", "scale_only", "sphere_only", "hps_adam", "mask",
           "hyper", "film_id")
"""Sharing modes: no sharing, full sharing, full sharing + agent ID, HPS, its two ablations, HPS
with the sphere kept by elementwise Adam, and three agent-conditioned baselines (learned masks,
a hypernetwork output layer, FiLM)."""

LABELS = {"nops": "NoPS", "fups": "FuPS", "fups_id": "FuPS+ID", "hps": "HPS",
          "scale_only": "scale-only", "sphere_only": "sphere-only", "hps_adam": "HPS-Adam",
          "mask": "mask", "hyper": "hyper-out", "film_id": "FiLM-ID"}
"""Display names of :data:`METHODS`."""

VARIANTS = ("conflict", "control", "rotation", "mixed")
"""Heterogeneity of :func:`variant`: gains, none, rotations, or both."""

CONFLICT_GAINS = (0.25, 0.5, 2.0, 4.0)
"""Hidden actuator gains of the conflict variant: the right action scales differ by 16x."""

_SPHERE = {"hps", "sphere_only"}              # rows on the sphere, geoopt's Riemannian Adam
_UNIT_ROWS = {"hps", "sphere_only", "hps_adam"}  # rows kept at unit length
_AGENT_SCALES = {"hps", "scale_only", "hps_adam"}
_SCALED = {"hps", "scale_only", "sphere_only", "hps_adam"}


# --- small checks -----------------------------------------------------------------------------


def _check_int(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


def check_gains(gains) -> torch.Tensor:
    """Return ``gains`` as a float64 tensor after checking that they are finite and positive."""
    gains = torch.as_tensor(gains, dtype=torch.float64).reshape(-1)
    if gains.numel() < 1:
        raise ValueError("need at least one agent: got an empty list of gains")
    if not torch.isfinite(gains).all():
        raise ValueError(f"actuator gains must be finite, got {gains.tolist()}")
    if (gains <= 0).any():
        raise ValueError(f"actuator gains must be positive, got {gains.tolist()}")
    return gains


def variant_gains(variant: str, n_agents: int = 4, spread: float = 16.0) -> tuple[float, ...]:
    """Gains of the ``"conflict"`` variant (geometric, max/min = ``spread``) or the ``"control"``.

    With four agents and ``spread=16`` the conflict gains are :data:`CONFLICT_GAINS`'s range
    (geometrically spaced, so (0.25, 0.63, 1.59, 4) rather than (0.25, 0.5, 2, 4)); the control
    variant gives every agent gain 1, so no agent needs a different scale.
    """
    n_agents = _check_int(n_agents, "n_agents", 1)
    if variant == "control":
        return (1.0,) * n_agents
    if variant != "conflict":
        raise ValueError(f"variant must be 'conflict' or 'control', got {variant!r}")
    if not (math.isfinite(spread) and spread >= 1):
        raise ValueError(f"spread must be a finite number >= 1, got {spread}")
    if n_agents == 1:
        return (1.0,)
    exps = np.linspace(-0.5, 0.5, n_agents)
    return tuple(float(spread ** e) for e in exps)


def variant(name: str, n_agents: int = 4, spread: float = 16.0,
            max_angle: float = 0.75 * math.pi, gains=None) -> dict:
    """Keyword arguments of :class:`GainReach` for one heterogeneity variant (:data:`VARIANTS`).

    ``conflict``: geometric gains (max/min = ``spread``), no rotation; ``control``: equal gains;
    ``rotation``: equal gains and actuator rotations evenly spread over
    ``[-max_angle, max_angle]`` (the falsification control: agents need different *directions* at
    the same scale); ``mixed``: both. ``gains`` replaces the geometric gains of ``conflict`` and
    ``mixed`` (e.g. :data:`CONFLICT_GAINS`).
    """
    if name not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {name!r}")
    n_agents = _check_int(n_agents, "n_agents", 1)
    spread_gains = name in ("conflict", "mixed")
    if spread_gains and gains is not None:
        gains = tuple(float(g) for g in check_gains(gains))
        if len(gains) != n_agents:
            raise ValueError(f"need {n_agents} gains, got {len(gains)}")
    else:
        gains = variant_gains("conflict" if spread_gains else "control", n_agents, spread)
    angles = None
    if name in ("rotation", "mixed"):
        angles = tuple(float(a) for a in np.linspace(-max_angle, max_angle, n_agents))
    return {"gains": gains, "angles": angles}


# --- environment ------------------------------------------------------------------------------


class GainReach:
    """Cooperative reaching with hidden actuator gains and rotations, vectorised.

    State: positions and goals of ``N`` agents in the plane, drawn uniformly from ``[-1, 1]^2``.
    Agent ``k`` observes ``goal_k - pos_k`` and moves by ``gain_k * R_k action_k`` (``R_k`` the
    rotation by ``angles[k]``, the identity when ``angles`` is ``None``); every agent gets the team
    reward ``-(1/N) sum_k ||goal_k - pos_k||`` after the move. The oracle plays
    ``R_k^T (goal - pos) / gain`` (eq-hps-oracle) and earns 0; the zero policy earns ``-T`` times
    the mean initial distance. Tensors are shaped ``(S, N, B, ...)``: seeds, agents, episodes.

    With ``obs_dim > 2`` the observation is ``Q (goal - pos)`` for a fixed random matrix ``Q``
    with orthonormal columns (``obs_dim - distractors`` rows, drawn from ``embed_seed``),
    followed by ``distractors`` coordinates of fresh uniform noise at every step.
    """

    act_dim = 2

    def __init__(self, gains, horizon: int = 8, angles=None, obs_dim: int = 2,
                 distractors: int = 0, embed_seed: int = 0):
        self.gains = check_gains(gains).float()
        self.n_agents = self.gains.numel()
        self.horizon = _check_int(horizon, "horizon", 1)
        self.obs_dim = _check_int(obs_dim, "obs_dim", 2)
        self.distractors = _check_int(distractors, "distractors", 0)
        if self.obs_dim - self.distractors < 2:
            raise ValueError(f"need at least two signal dimensions: obs_dim={obs_dim}, "
                             f"distractors={distractors}")
        if angles is None:
            self.rot = None
        else:
            angles = torch.as_tensor(angles, dtype=torch.float32).reshape(-1)
            if angles.numel() != self.n_agents or not torch.isfinite(angles).all():
                raise ValueError(f"need {self.n_agents} finite angles, got {angles.tolist()}")
            c, s = torch.cos(angles), torch.sin(angles)
            self.rot = torch.stack([torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2)
        signal = self.obs_dim - self.distractors
        if signal == 2:
            self.embed = None
        else:
            gen = torch.Generator().manual_seed(int(embed_seed))
            q, _ = torch.linalg.qr(torch.randn(signal, 2, generator=gen))
            self.embed = q                                           # (signal, 2)
        self._noise_gen = None

    def _observe(self) -> torch.Tensor:
        delta = self.goal - self.pos
        if self.embed is None and self.distractors == 0:
            return delta
        obs = delta if self.embed is None else delta @ self.embed.T
        if self.distractors:
            noise = 2 * torch.rand((*delta.shape[:-1], self.distractors),
                                   generator=self._noise_gen) - 1
            obs = torch.cat([obs, noise], dim=-1)
        return obs

    def reset(self, n_seeds: int, batch: int, generator: torch.Generator) -> torch.Tensor:
        """Draw ``batch`` episodes per seed; return observations ``(S, N, B, obs_dim)``."""
        shape = (_check_int(n_seeds, "n_seeds", 1), self.n_agents,
                 _check_int(batch, "batch", 1), 2)
        self.pos = 2 * torch.rand(shape, generator=generator) - 1
        self.goal = 2 * torch.rand(shape, generator=generator) - 1
        self._noise_gen = generator
        self.t = 0
        return self._observe()

    def distances(self) -> torch.Tensor:
        """Distance of each agent to its goal, shape ``(S, N, B)``."""
        return torch.linalg.vector_norm(self.goal - self.pos, dim=-1)

    def moves(self, actions: torch.Tensor) -> torch.Tensor:
        """Displacements ``gain_k R_k a_k`` of actions ``(S, N, B, 2)``."""
        if self.rot is not None:
            actions = torch.einsum("nij,snbj->snbi", self.rot, actions)
        return self.gains.view(1, -1, 1, 1) * actions

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """Apply ``actions`` ``(S, N, B, 2)``; return observations, team reward ``(S, B)``, done."""
        if actions.shape != self.pos.shape:
            raise ValueError(f"actions must have shape {tuple(self.pos.shape)}, "
                             f"got {tuple(actions.shape)}")
        self.pos = self.pos + self.moves(actions)
        self.t += 1
        reward = -self.distances().mean(dim=1)
        return self._observe(), reward, self.t >= self.horizon

    def oracle_actions(self) -> torch.Tensor:
        """The optimal actions ``R_k^T (goal - pos) / gain_k`` of eq-hps-oracle."""
        delta = (self.goal - self.pos) / self.gains.view(1, -1, 1, 1)
        if self.rot is not None:
            delta = torch.einsum("nji,snbj->snbi", self.rot, delta)
        return delta


def _pettingzoo_base():
    from pettingzoo import ParallelEnv

    return ParallelEnv


class GainReachParallelEnv(_pettingzoo_base()):
    """One GainReach episode at a time behind PettingZoo's parallel API (numpy, float32).

    ``reset(seed)`` returns ``(observations, infos)`` and ``step(actions)`` returns
    ``(observations, rewards, terminations, truncations, infos)``, each a dict keyed by agent
    name; every agent receives the team reward. Episodes end by truncation after ``horizon``
    steps. Actions are clipped to ``[-action_bound, action_bound]`` (the action space).
    """

    metadata = {"name": "gain_reach_v0", "render_modes": []}

    def __init__(self, gains=CONFLICT_GAINS, horizon: int = 8, action_bound: float = 10.0):
        from gymnasium import spaces

        self._core = GainReach(gains, horizon)
        self.possible_agents = [f"agent_{k}" for k in range(self._core.n_agents)]
        self.agents = []
        self.action_bound = float(action_bound)
        self._obs_space = spaces.Box(-4.0, 4.0, shape=(2,), dtype=np.float32)
        self._act_space = spaces.Box(-self.action_bound, self.action_bound, shape=(2,),
                                     dtype=np.float32)
        self.render_mode = None

    def observation_space(self, agent):
        return self._obs_space

    def action_space(self, agent):
        return self._act_space

    def _observations(self, obs: torch.Tensor) -> dict:
        arr = obs[0, :, 0].numpy().astype(np.float32)
        return {a: np.clip(arr[k], -4.0, 4.0) for k, a in enumerate(self.possible_agents)}

    def reset(self, seed=None, options=None):
        gen = torch.Generator()
        gen.manual_seed(int(np.random.SeedSequence(seed).generate_state(1)[0]))
        obs = self._core.reset(1, 1, gen)
        self.agents = list(self.possible_agents)
        return self._observations(obs), {a: {} for a in self.agents}

    def step(self, actions):
        missing = [a for a in self.agents if a not in actions]
        if missing:
            raise ValueError(f"missing actions for {missing}")
        act = torch.stack([torch.as_tensor(np.clip(actions[a], -self.action_bound,
                                                   self.action_bound), dtype=torch.float32)
                           for a in self.possible_agents]).view(1, -1, 1, 2)
        obs, reward, done = self._core.step(act)
        r = float(reward[0, 0])
        agents = list(self.agents)
        out = (self._observations(obs), {a: r for a in agents},
               {a: False for a in agents}, {a: done for a in agents}, {a: {} for a in agents})
        if done:
            self.agents = []
        return out


# --- a public benchmark: MPE's simple_spread (mpe2 ``simple_spread_v3``) -----------------------


SPREAD_SENSITIVITY = 5.0
"""mpe2's default acceleration of an agent (``Agent.accel = None`` means 5)."""


class Spread:
    """MPE's ``simple_spread`` (N agents, N landmarks), vectorised in torch, continuous actions.

    A re-implementation of mpe2's ``simple_spread_v3`` (``continuous_actions=True``,
    ``local_ratio=0.5``, ``max_cycles=25``), checked step by step against mpe2 in the tests:
    the same observations and rewards for the same initial state and actions. Agent ``k``'s
    two-dimensional action ``a_k`` is clipped to ``[-1, 1]^2`` (mpe2 clips its five-dimensional
    action to ``[0, 1]`` and uses the differences of the move pairs) and pushes with force
    ``accel_k * a_k``, ``accel_k = 5 * scales[k]`` (mpe2's ``Agent.accel``; ``scales`` are the
    per-agent action scales, all 1 in the benchmark). Physics as mpe2: ``dt = 0.1``, damping
    0.25, mass 1, agents of radius 0.15 pushed apart by a soft contact force; landmarks are
    fixed. Each agent's reward is ``0.5 * global + 0.5 * local``: ``global`` is minus the sum
    over landmarks of the distance to the nearest agent, ``local`` minus the number of other
    agents it overlaps. Observation of agent ``k`` (``6 N`` numbers): its velocity, its
    position, the landmarks relative to it, the other agents relative to it, and ``2 (N - 1)``
    zeros (the silent agents' communication). Tensors are shaped ``(S, N, B, ...)`` as in
    :class:`GainReach`; :meth:`step` returns per-agent rewards ``(S, N, B)``.
    """

    act_dim = 2
    dt, damping, contact_force, contact_margin, size = 0.1, 0.25, 100.0, 1e-3, 0.15

    def __init__(self, scales=(1.0, 1.0, 1.0), horizon: int = 25, local_ratio: float = 0.5,
                 dtype=torch.float32):
        self.scales = check_gains(scales).to(dtype)
        self.n_agents = self.scales.numel()
        if self.n_agents < 2:
            raise ValueError("simple_spread needs at least two agents")
        self.horizon = _check_int(horizon, "horizon", 1)
        if not 0.0 <= float(local_ratio) <= 1.0:
            raise ValueError(f"local_ratio must lie in [0, 1], got {local_ratio}")
        self.local_ratio = float(local_ratio)
        self.dtype = dtype
        self.obs_dim = 6 * self.n_agents
        n = self.n_agents
        self._others = torch.tensor([[j for j in range(n) if j != k] for k in range(n)])

    def set_state(self, pos: torch.Tensor, landmarks: torch.Tensor,
                  vel: torch.Tensor | None = None) -> torch.Tensor:
        """Start from given agent positions ``(S, N, B, 2)`` and landmarks ``(S, N, B, 2)``
        (landmark ``l`` of episode ``b`` at ``landmarks[:, l, b]``); returns observations."""
        self.pos = pos.to(self.dtype).clone()
        self.vel = torch.zeros_like(self.pos) if vel is None else vel.to(self.dtype).clone()
        self.landmarks = landmarks.to(self.dtype).clone()
        if self.pos.shape != self.landmarks.shape or self.pos.shape[1] != self.n_agents:
            raise ValueError(f"need positions and landmarks of shape (S, {self.n_agents}, B, 2), "
                             f"got {tuple(self.pos.shape)} and {tuple(self.landmarks.shape)}")
        self.t = 0
        return self._observe()

    def reset(self, n_seeds: int, batch: int, generator: torch.Generator) -> torch.Tensor:
        """Draw ``batch`` episodes per seed (positions uniform on ``[-1, 1]^2``, as mpe2)."""
        shape = (_check_int(n_seeds, "n_seeds", 1), self.n_agents,
                 _check_int(batch, "batch", 1), 2)
        pos = 2 * torch.rand(shape, generator=generator) - 1
        return self.set_state(pos, 2 * torch.rand(shape, generator=generator) - 1)

    def _observe(self) -> torch.Tensor:
        others = self.pos[:, self._others] - self.pos.unsqueeze(2)         # (S, N, N-1, B, 2)
        marks = self.landmarks.unsqueeze(1) - self.pos.unsqueeze(2)        # (S, N, N, B, 2)
        s, n, b = self.pos.shape[:3]
        rel = torch.cat([marks, others], 2).permute(0, 1, 3, 2, 4).reshape(s, n, b, -1)
        comm = torch.zeros(s, n, b, 2 * (n - 1), dtype=self.dtype)
        return torch.cat([self.vel, self.pos, rel, comm], -1)

    def _pair_distances(self) -> tuple[torch.Tensor, torch.Tensor]:
        delta = self.pos.unsqueeze(2) - self.pos.unsqueeze(1)              # (S, N, N, B, 2)
        return delta, torch.linalg.vector_norm(delta, dim=-1)

    def rewards(self) -> torch.Tensor:
        """Each agent's reward in the current state, ``(S, N, B)``."""
        marks = torch.linalg.vector_norm(self.landmarks.unsqueeze(1) - self.pos.unsqueeze(2),
                                         dim=-1)                            # (S, agent, mark, B)
        glob = -marks.min(dim=1).values.sum(1)                              # (S, B)
        _, dist = self._pair_distances()
        eye = torch.eye(self.n_agents, dtype=torch.bool).view(1, self.n_agents, self.n_agents, 1)
        local = -((dist < 2 * self.size) & ~eye).sum(2).to(self.dtype)     # (S, N, B)
        return (1 - self.local_ratio) * glob.unsqueeze(1) + self.local_ratio * local

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """Apply actions ``(S, N, B, 2)``; return observations, rewards ``(S, N, B)``, done."""
        if actions.shape != self.pos.shape:
            raise ValueError(f"actions must have shape {tuple(self.pos.shape)}, "
                             f"got {tuple(actions.shape)}")
        accel = SPREAD_SENSITIVITY * self.scales.view(1, -1, 1, 1)
        force = accel * actions.to(self.dtype).clamp(-1.0, 1.0)
        delta, dist = self._pair_distances()
        k = self.contact_margin
        # softplus below -50 is under 2e-22 (mpe2 computes it in float64): clamping keeps
        # float32 out of subnormal numbers, which are very slow on CPUs
        pen = k * torch.nn.functional.softplus((-(dist - 2 * self.size) / k).clamp_min(-50.0))
        eye = torch.eye(self.n_agents, dtype=torch.bool).view(1, self.n_agents, self.n_agents, 1)
        push = self.contact_force * delta / dist.masked_fill(eye, 1.0).unsqueeze(-1) \
            * pen.masked_fill(eye, 0.0).unsqueeze(-1)
        force = force + push.sum(2)
        self.pos = self.pos + self.vel * self.dt
        self.vel = self.vel * (1 - self.damping) + force * self.dt
        self.t += 1
        return self._observe(), self.rewards(), self.t >= self.horizon


def mpe2_spread(scales=(1.0, 1.0, 1.0), max_cycles: int = 25):
    """mpe2's ``simple_spread_v3`` (parallel API, continuous actions) with agent ``k``'s
    acceleration multiplied by ``scales[k]`` (the per-agent action scales)."""
    from mpe2 import simple_spread_v3

    scales = check_gains(scales).tolist()
    env = simple_spread_v3.parallel_env(N=len(scales), max_cycles=max_cycles,
                                        continuous_actions=True)
    for agent, scale in zip(env.unwrapped.world.agents, scales, strict=True):
        agent.accel = SPREAD_SENSITIVITY * scale
    return env


def mpe2_action(action) -> np.ndarray:
    """mpe2's five-dimensional continuous action for a two-dimensional ``action``."""
    a = np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
    return np.array([0.0, max(-a[0], 0.0), max(a[0], 0.0), max(-a[1], 0.0), max(a[1], 0.0)],
                    dtype=np.float32)


# --- geometry ---------------------------------------------------------------------------------


def unit_rows(w: torch.Tensor) -> torch.Tensor:
    """Rows of ``w`` (last dimension) scaled to unit length."""
    return w / torch.linalg.vector_norm(w, dim=-1, keepdim=True)


def decompose(w: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Radial magnitude ``r = <w/|w|, g>`` and tangential part ``g - r w/|w|`` (eq-hps-decompose).

    Works row by row along the last dimension; ``r`` drops that dimension.
    """
    if w.shape[-1] != g.shape[-1]:
        raise ValueError(f"rows of w and g differ in width: {w.shape[-1]} vs {g.shape[-1]}")
    u = unit_rows(w)
    r = (u * g).sum(-1)
    return r, g - r.unsqueeze(-1) * u


def tangent_project(u: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Riemannian gradient on the unit sphere: ``(I - u u^T) g`` row by row (eq-hps-rgrad)."""
    return g - (u * g).sum(-1, keepdim=True) * u


def retract(x: torch.Tensor) -> torch.Tensor:
    """Retraction onto the unit sphere by normalisation (eq-hps-rgrad)."""
    return unit_rows(x)


def riemannian_sgd_step(u: torch.Tensor, egrad: torch.Tensor, lr: float) -> torch.Tensor:
    """One Riemannian SGD step on the sphere: project, step, normalise (eq-hps-rgrad)."""
    return retract(u - lr * tangent_project(u, egrad))


def pairwise_cosines(vectors: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Mean cosine over the pairs of the first dimension (agents), for each remaining index.

    ``vectors`` has shape ``(N, ..., d)``; returns shape ``(...)``. Rows of zero length count as
    cosine 0.
    """
    n = vectors.shape[0]
    if n < 2:
        raise ValueError("agreement between agents needs at least two agents")
    unit = vectors / torch.linalg.vector_norm(vectors, dim=-1, keepdim=True).clamp_min(eps)
    total = torch.zeros(vectors.shape[1:-1], dtype=vectors.dtype)
    for k in range(n):
        for m in range(k + 1, n):
            total += (unit[k] * unit[m]).sum(-1)
    return total / (n * (n - 1) / 2)


# --- policy -----------------------------------------------------------------------------------


@dataclass
class _Layer:
    weight: torch.Tensor          # (S, N or 1, out, in): Euclidean weights or sphere rows
    bias: torch.Tensor            # (S, N or 1, out)
    log_scale: torch.Tensor | None = None  # (S, N or 1, out): agent (or shared) row scales
    mask: torch.Tensor | None = None       # (S, N, out, in): mask logits, W_k = 2 sigmoid(m) W
    film: tuple | None = None              # (gamma, beta), each (S, N, out)
    hyper: tuple | None = None             # (embedding (S, N, e), generator (S, 1, out*(in+1), e))


HYPER_EMBED = 8
"""Width of the agent embedding that feeds the hypernetwork output layer (``hyper``)."""


class AgentPolicy(nn.Module):
    """Gaussian policy for ``N`` agents and ``S`` independent seeds in one sharing ``method``.

    Layer ``l`` of agent ``k`` computes ``h_out = act(W_k h_in + b_k)``; the modes differ in
    ``W_k`` and ``b_k``:

    * ``nops``: ``W_k`` and ``b_k`` separate for each agent;
    * ``fups``: one ``W`` for all; ``fups_id``: the same, with a one-hot agent ID appended to the
      observation;
    * ``hps``: ``W_k = diag(s_k) U`` with ``U``'s rows on the unit sphere (eq-hps-layer) and
      agent scales ``s_k = exp(log_s_k)`` (the scale generator: one embedding per agent);
    * ``scale_only``: ``W_k = diag(s_k) W`` with Euclidean shared ``W``;
    * ``sphere_only``: ``W = diag(s) U``, sphere rows with one scale vector for all agents;
    * ``hps_adam``: HPS's function, but ``U`` is a plain parameter trained by elementwise Adam on
      the tangential gradient and renormalised after each step (the optimiser of ``scale_only``);
    * ``mask``: ``W_k = 2 sigmoid(M_k) * W`` with learned per-agent, per-weight mask logits
      ``M_k`` (a soft version of Kaleidoscope's learned masks, starting at 1);
    * ``hyper``: shared hidden layers, output layer ``[W_k, b_k] = [W, b] + G z_k`` generated from
      a learned agent embedding ``z_k`` by a linear hypernetwork ``G`` (HyperMARL's idea, output
      layer only; ``G`` starts at 0);
    * ``film_id``: shared weights; every hidden pre-activation is modulated per agent,
      ``(1 + gamma_k) * (W h) + b + beta_k`` (FiLM from the agent ID; ``gamma, beta`` start at 0).

    Every mode starts from the *same* draw of PyTorch's default Linear initialisation (per seed;
    per agent for ``nops``), and all shared modes except ``fups_id`` compute the same function at
    initialisation (the scaled modes start with ``s`` equal to the initial row norms,
    ``scale_only`` with ``s = 1``). The action mean is the last layer's output (no activation);
    the action noise is fixed.
    """

    def __init__(self, method: str, n_agents: int, n_seeds: int = 1, hidden: int = 32,
                 depth: int = 2, obs_dim: int = 2, act_dim: int = 2, seed: int = 0):
        super().__init__()
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; choose one of {METHODS}")
        self.method = method
        self.n_agents = _check_int(n_agents, "n_agents", 1)
        self.n_seeds = _check_int(n_seeds, "n_seeds", 1)
        self.obs_dim = _check_int(obs_dim, "obs_dim", 1)
        self.act_dim = _check_int(act_dim, "act_dim", 1)
        hidden = _check_int(hidden, "hidden", 1)
        depth = _check_int(depth, "depth", 1)
        in_dim = obs_dim + (n_agents if method == "fups_id" else 0)
        sizes = [in_dim] + [hidden] * depth + [act_dim]
        gen = torch.Generator().manual_seed(int(seed))
        groups = n_agents if method == "nops" else 1
        self.layers: list[_Layer] = []
        self.sphere_params = nn.ParameterList()
        self.euclid_params = nn.ParameterList()
        self.unit_params = nn.ParameterList()     # rows renormalised after every step
        last = len(sizes) - 2
        for index, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
            bound = 1.0 / math.sqrt(fan_in)
            w = (2 * torch.rand(n_seeds, groups, fan_out, fan_in, generator=gen) - 1) * bound
            b = (2 * torch.rand(n_seeds, groups, fan_out, generator=gen) - 1) * bound
            norms = torch.linalg.vector_norm(w, dim=-1)
            layer = _Layer(None, nn.Parameter(b))
            extra = []
            if method in _SPHERE:
                layer.weight = geoopt.ManifoldParameter(unit_rows(w), manifold=geoopt.Sphere())
                self.sphere_params.append(layer.weight)
            elif method == "hps_adam":
                layer.weight = nn.Parameter(unit_rows(w))
                self.unit_params.append(layer.weight)
                self.euclid_params.append(layer.weight)
                layer.weight.register_hook(_tangent_hook(layer.weight))
            else:
                layer.weight = nn.Parameter(w)
                self.euclid_params.append(layer.weight)
            if method in _UNIT_ROWS:
                scale_groups = n_agents if method in _AGENT_SCALES else 1
                layer.log_scale = nn.Parameter(norms.log().expand(-1, scale_groups, -1).clone())
            elif method == "scale_only":
                layer.log_scale = nn.Parameter(torch.zeros(n_seeds, n_agents, fan_out))
            elif method == "mask":
                layer.mask = nn.Parameter(torch.zeros(n_seeds, n_agents, fan_out, fan_in))
                extra.append(layer.mask)
            elif method == "film_id" and index < last:
                layer.film = (nn.Parameter(torch.zeros(n_seeds, n_agents, fan_out)),
                              nn.Parameter(torch.zeros(n_seeds, n_agents, fan_out)))
                extra.extend(layer.film)
            elif method == "hyper" and index == last:
                z = torch.randn(n_seeds, n_agents, HYPER_EMBED, generator=gen)
                layer.hyper = (nn.Parameter(z), nn.Parameter(
                    torch.zeros(n_seeds, 1, fan_out * (fan_in + 1), HYPER_EMBED)))
                extra.extend(layer.hyper)
            self.euclid_params.append(layer.bias)
            if layer.log_scale is not None:
                self.euclid_params.append(layer.log_scale)
            self.euclid_params.extend(extra)
            self.layers.append(layer)

    def _hyper_delta(self, layer: _Layer) -> torch.Tensor:
        z, g = layer.hyper
        return (g @ z.unsqueeze(-1)).squeeze(-1)            # (S, N, out * (in + 1))

    def agent_weights(self, index: int) -> torch.Tensor:
        """Effective weights ``W_k`` of layer ``index``, shape ``(S, N or 1, out, in)``."""
        layer = self.layers[index]
        w = layer.weight
        if layer.log_scale is not None:
            w = layer.log_scale.exp().unsqueeze(-1) * w
        if layer.mask is not None:
            w = 2 * torch.sigmoid(layer.mask) * w
        if layer.film is not None:
            w = (1 + layer.film[0]).unsqueeze(-1) * w
        if layer.hyper is not None:
            out, fan_in = w.shape[-2:]
            w = w + self._hyper_delta(layer)[..., : out * fan_in].unflatten(-1, (out, fan_in))
        return w

    def agent_bias(self, index: int) -> torch.Tensor:
        """Effective biases ``b_k`` of layer ``index``, shape ``(S, N or 1, out)``."""
        layer = self.layers[index]
        b = layer.bias
        if layer.film is not None:
            b = (1 + layer.film[0]) * b + layer.film[1]
        if layer.hyper is not None:
            out, fan_in = layer.weight.shape[-2:]
            b = b + self._hyper_delta(layer)[..., out * fan_in:]
        return b

    def effective_weights(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(W_k, b_k)`` of every layer, to reuse over the steps of a rollout."""
        return [(self.agent_weights(i), self.agent_bias(i)) for i in range(len(self.layers))]

    def forward(self, obs: torch.Tensor, weights: list | None = None) -> torch.Tensor:
        """Action means for observations ``(S, N, B, obs_dim)``; returns ``(S, N, B, act_dim)``.

        ``weights`` (from :meth:`effective_weights`, computed once per rollout) saves recomputing
        ``diag(s_k) U`` at every step; the result is the same.
        """
        if obs.dim() != 4 or obs.shape[:2] != (self.n_seeds, self.n_agents):
            raise ValueError(f"observations must have shape (S={self.n_seeds}, "
                             f"N={self.n_agents}, B, {self.obs_dim}), got {tuple(obs.shape)}")
        if obs.shape[-1] != self.obs_dim:
            raise ValueError(f"observation width {obs.shape[-1]} does not match the policy's "
                             f"obs_dim={self.obs_dim}")
        h = obs
        if self.method == "fups_id":
            ids = torch.eye(self.n_agents).view(1, self.n_agents, 1, self.n_agents)
            h = torch.cat([h, ids.expand(*obs.shape[:3], self.n_agents)], dim=-1)
        last = len(self.layers) - 1
        if weights is None:
            weights = self.effective_weights()
        elif len(weights) != len(self.layers):
            raise ValueError(f"need {len(self.layers)} weight tensors, got {len(weights)}")
        for index, (w, b) in enumerate(weights):
            h = h @ w.transpose(-1, -2) + b.unsqueeze(-2)
            if index < last:
                h = torch.tanh(h)
        return h

    def parameter_count(self) -> int:
        """Trainable numbers per seed (backbone, biases and scale generator together)."""
        return sum(p.numel() for p in self.parameters()) // self.n_seeds

    def renormalise(self) -> None:
        """Put unit rows back on the unit sphere exactly (float drift; ``hps_adam``'s steps)."""
        with torch.no_grad():
            for p in list(self.sphere_params) + list(self.unit_params):
                p.copy_(unit_rows(p))


def _tangent_hook(param: torch.Tensor):
    """Gradient hook: project a unit-row parameter's gradient on the tangent space."""
    def hook(grad: torch.Tensor) -> torch.Tensor:
        return tangent_project(param.detach(), grad)
    return hook


# --- learning ---------------------------------------------------------------------------------


def rollout(policy: AgentPolicy, env: GainReach, batch: int, generator: torch.Generator,
            sigma: float, weights: list | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample episodes; return log-probabilities ``(T, S, N, B)`` and the environment's rewards
    (team rewards ``(T, S, B)`` for :class:`GainReach`, per agent ``(T, S, N, B)`` for
    :class:`Spread`). ``weights`` (as :meth:`AgentPolicy.effective_weights`) replace the
    policy's own."""
    obs = env.reset(policy.n_seeds, batch, generator)
    if weights is None:
        weights = policy.effective_weights()
    logps, rewards = [], []
    for _ in range(env.horizon):
        mean = policy(obs, weights)
        noise = torch.randn(mean.shape, generator=generator)
        action = (mean + sigma * noise).detach()
        logps.append(-((action - mean) ** 2).sum(-1) / (2 * sigma**2))
        obs, reward, _ = env.step(action)
        rewards.append(reward)
    return torch.stack(logps), torch.stack(rewards)


def agent_losses(logps: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """REINFORCE surrogate of each agent (eq-hps-reinforce), summed over seeds: shape ``(N,)``.

    The advantage is the reward-to-go minus its mean over the episodes of the same seed and step.
    ``rewards`` are team rewards ``(T, S, B)`` or each agent's own ``(T, S, N, B)``.
    """
    returns = rewards.flip(0).cumsum(0).flip(0)
    adv = returns - returns.mean(dim=-1, keepdim=True)
    if adv.dim() == 3:
        adv = adv.unsqueeze(2)
    return -(logps * adv).mean(dim=-1).sum(dim=0).sum(dim=0)


@torch.no_grad()
def normalised_return(policy: AgentPolicy, env: GainReach, batch: int,
                      generator: torch.Generator) -> torch.Tensor:
    """Return of the deterministic policy (action = mean), 0 for zero actions, 1 for the oracle.

    Computed on the same episodes for all three, one value per seed: ``1 - R / R_zero``.
    """
    obs = env.reset(policy.n_seeds, batch, generator)
    zero = -env.horizon * env.distances().mean(dim=(1, 2))
    total = torch.zeros(policy.n_seeds)
    weights = policy.effective_weights()
    for _ in range(env.horizon):
        obs, reward, _ = env.step(policy(obs, weights))
        total += reward.mean(-1)
    return 1 - total / zero


@dataclass
class TrainResult:
    """Outcome of :func:`train`: curves and final values per seed, and the trained policy."""

    method: str
    steps: list[int]
    curve: np.ndarray            # (len(steps), S) normalised return
    final: np.ndarray            # (S,)
    policy: AgentPolicy = field(repr=False)
    seconds: float = 0.0


def make_optimizers(policy: AgentPolicy, lr: float, sphere_lr: float | None = None):
    """Adam for Euclidean parameters; geoopt's Riemannian Adam for sphere rows (eq-hps-rgrad)."""
    optims = [torch.optim.Adam(policy.euclid_params, lr=lr)]
    if len(policy.sphere_params):
        optims.append(geoopt.optim.RiemannianAdam(policy.sphere_params,
                                                  lr=lr if sphere_lr is None else sphere_lr))
    return optims


class SeedAdam:
    """Adam with one learning rate per seed, for parameters stacked over seeds (dimension 0).

    Euclidean parameters take torch's Adam step; sphere rows (``policy.sphere_params``) take
    geoopt's Riemannian Adam step on the ``Sphere`` (tangent projection, a second moment per row,
    retraction by normalisation, momentum transported by projection), so that with one learning
    rate for every seed it equals ``torch.optim.Adam`` and ``geoopt.optim.RiemannianAdam``
    (a unit test checks both). ``lr`` and ``sphere_lr`` are numbers or one value per seed.
    """

    def __init__(self, policy: AgentPolicy, lr, sphere_lr=None, betas=(0.9, 0.999),
                 eps: float = 1e-8):
        n_seeds = policy.n_seeds
        self.lr = torch.as_tensor(lr, dtype=torch.float32).reshape(-1).expand(n_seeds)
        self.sphere_lr = None if sphere_lr is None else torch.as_tensor(
            sphere_lr, dtype=torch.float32).reshape(-1).expand(n_seeds)
        self.betas, self.eps, self.t = betas, eps, 0
        self.params = [(p, False) for p in policy.euclid_params]
        self.params += [(p, True) for p in policy.sphere_params]
        self.state = {id(p): (torch.zeros_like(p), torch.zeros_like(p)) for p, _ in self.params}

    def zero_grad(self) -> None:
        for p, _ in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        b1, b2 = self.betas
        self.t += 1
        bc1, bc2 = 1 - b1**self.t, 1 - b2**self.t
        for p, on_sphere in self.params:
            if p.grad is None:
                continue
            m, v = self.state[id(p)]
            view = (-1,) + (1,) * (p.dim() - 1)
            if not on_sphere:
                g = p.grad
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                denom = (v.sqrt() / math.sqrt(bc2)).add_(self.eps)
                p.sub_(self.lr.view(view) / bc1 * m / denom)
                continue
            lr = (self.lr * math.sqrt(p.shape[-1]) if self.sphere_lr is None
                  else self.sphere_lr).view(view)
            g = tangent_project(p, p.grad)
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).add_((g * g).sum(-1, keepdim=True), alpha=1 - b2)
            direction = (m / bc1) / ((v / bc2).sqrt() + self.eps)
            new = unit_rows(p - lr * direction)
            m.copy_(tangent_project(new, m))
            p.copy_(new)


def train(method: str, gains, *, n_seeds: int = 4, seed: int = 0, updates: int = 100,
          batch: int = 256, hidden: int = 32, lr: float = 3e-3, sphere_lr: float | None = None,
          sigma: float = 0.1, horizon: int = 8, eval_every: int = 10, eval_batch: int = 512,
          angles=None, obs_dim: int = 2, distractors: int = 0) -> TrainResult:
    """Train ``n_seeds`` independent policies of one sharing ``method`` with REINFORCE.

    Every method gets the same environment draws (``seed``), the same number of updates and the
    same learning rates. ``lr`` is one number or one per seed (:class:`SeedAdam`, so a learning
    rate grid trains as one batch). ``sphere_lr`` is the Riemannian Adam rate of sphere rows
    (``lr`` scaled by the square root of the fan-in when ``None``: geoopt normalises the second
    moment per row, so this matches the length of an elementwise Adam step on a row).
    ``angles``, ``obs_dim`` and ``distractors`` configure :class:`GainReach`.
    """
    import time

    updates = _check_int(updates, "updates", 0)
    eval_every = _check_int(eval_every, "eval_every", 1)
    for name, value in (("lr", lr), ("sigma", sigma)) + (
            (("sphere_lr", sphere_lr),) if sphere_lr is not None else ()):
        values = np.asarray(value, dtype=float).reshape(-1)
        if values.size not in (1, n_seeds) or not (np.isfinite(values).all()
                                                     and (values > 0).all()):
            raise ValueError(f"{name} must be a finite positive number (or one per seed), "
                             f"got {value!r}")
    env = GainReach(gains, horizon, angles=angles, obs_dim=obs_dim, distractors=distractors)
    policy = AgentPolicy(method, env.n_agents, n_seeds, hidden=hidden, seed=seed,
                         obs_dim=env.obs_dim)
    optims = [SeedAdam(policy, lr, sphere_lr)]
    gen = torch.Generator().manual_seed(10_000 + int(seed))
    eval_gen_seed = 20_000 + int(seed)
    steps, curve = [], []
    start = time.process_time()
    for update in range(updates + 1):
        if update % eval_every == 0 or update == updates:
            steps.append(update)
            curve.append(normalised_return(policy, env, eval_batch,
                                           torch.Generator().manual_seed(eval_gen_seed)).numpy())
        if update == updates:
            break
        policy_gradient_update(policy, env, batch, gen, sigma, optims)
    curve = np.array(curve)
    return TrainResult(method, steps, curve, curve[-1], policy, time.process_time() - start)


def policy_gradient_update(policy: AgentPolicy, env: GainReach, batch: int,
                           generator: torch.Generator, sigma: float, optims) -> None:
    """One update: a batch of episodes, the sum of the agents' REINFORCE losses, a step of every
    optimiser, and the sphere's renormalisation of the HPS rows."""
    logps, rewards = rollout(policy, env, batch, generator, sigma)
    loss = agent_losses(logps, rewards).sum()
    for opt in optims:
        opt.zero_grad()
    loss.backward()
    for opt in optims:
        opt.step()
    policy.renormalise()


def select_lr(method: str, gains, grid=(1e-3, 3e-3, 1e-2), *, n_seeds: int = 4,
              seed: int = 0, **kwargs) -> tuple[float, np.ndarray]:
    """Pick ``method``'s learning rate from ``grid`` on held-out seeds.

    Trains ``n_seeds`` seeds per grid value in one batch (:class:`SeedAdam`'s per-seed rates)
    from the seed ``seed`` (use one that the comparison does not use) and returns the value with
    the best mean final normalised return, and the means, one per grid value (a one-value grid
    trains nothing and returns NaN as its mean). ``kwargs`` go to :func:`train`.
    """
    grid = tuple(float(g) for g in grid)
    n_seeds = _check_int(n_seeds, "n_seeds", 1)
    if len(grid) == 1:
        return grid[0], np.full(1, np.nan)
    lrs = np.repeat(grid, n_seeds)
    result = train(method, gains, n_seeds=lrs.size, seed=seed, lr=lrs, **kwargs)
    means = result.final.reshape(len(grid), n_seeds).mean(1)
    return grid[int(np.argmax(means))], means


# --- gradient decomposition analysis ----------------------------------------------------------


@dataclass
class GGDAStats:
    """Agreement between agents' gradients on shared rows, one value per seed (eq-hps-agree).

    ``tan``: mean pairwise cosine of the tangential parts; ``rad``: mean pairwise cosine of the
    radial parts (for a row this is the sign product of the radial magnitudes);
    ``rad_layer``: mean pairwise cosine of the vectors of radial magnitudes over a layer's rows;
    ``c_tan`` and ``c_rad``: the resultant ratios ``|sum_k v_k| / sum_k |v_k|``.
    """

    tan: np.ndarray
    rad: np.ndarray
    rad_layer: np.ndarray
    c_tan: np.ndarray
    c_rad: np.ndarray
    radial_share: np.ndarray
    weight: torch.Tensor = field(default=None, repr=False)   # (S, out, in) shared rows
    grads: torch.Tensor = field(default=None, repr=False)    # (N, S, out, in) per-agent gradients


def per_agent_gradients(policy: AgentPolicy, env: GainReach, batch: int,
                        generator: torch.Generator, sigma: float = 0.1,
                        layers: tuple[int, ...] | None = None) -> list[torch.Tensor]:
    """Gradient of each agent's own surrogate on the shared weights of the chosen layers.

    Returns, per layer, a tensor ``(N, S, out, in)``. Needs a method with shared weights.
    """
    if policy.method == "nops":
        raise ValueError("no-sharing policies have no shared weights to decompose")
    layers = tuple(range(len(policy.layers))) if layers is None else layers
    logps, rewards = rollout(policy, env, batch, generator, sigma)
    losses = agent_losses(logps, rewards)
    weights = [policy.layers[i].weight for i in layers]
    per_agent = [torch.autograd.grad(losses[k], weights, retain_graph=True)
                 for k in range(policy.n_agents)]
    return [torch.stack([grads[i][:, 0] for grads in per_agent]) for i in range(len(layers))]


def agreement(weight: torch.Tensor, grads: torch.Tensor) -> GGDAStats:
    """GGDA statistics of one layer: ``weight`` ``(S, out, in)``, ``grads`` ``(N, S, out, in)``."""
    r, tan = decompose(weight.unsqueeze(0), grads)            # (N, S, out), (N, S, out, in)
    tan_cos = pairwise_cosines(tan).mean(-1)                  # (S,)
    rad_cos = pairwise_cosines(r.unsqueeze(-1)).mean(-1)      # sign products
    rad_layer = pairwise_cosines(r)                           # (S,)
    c_tan = (torch.linalg.vector_norm(tan.sum(0), dim=-1)
             / torch.linalg.vector_norm(tan, dim=-1).sum(0)).mean(-1)
    c_rad = (r.sum(0).abs() / r.abs().sum(0)).mean(-1)
    share = (r**2).sum((0, 2)) / (grads**2).sum((0, 2, 3))
    return GGDAStats(*(x.detach().numpy() for x in (tan_cos, rad_cos, rad_layer, c_tan, c_rad,
                                                    share)), weight=weight, grads=grads)


def ggda(gains, *, n_seeds: int = 8, seed: int = 0, warmup: int = 10, batch: int = 512,
         hidden: int = 32, lr: float = 3e-3, sigma: float = 0.1, layers=(1, 2),
         method: str = "fups_id") -> dict[int, GGDAStats]:
    """Train a shared policy for ``warmup`` updates, then decompose each agent's gradient.

    Returns the statistics of each analysed layer (index into the policy's layers), each with the
    layer's rows and the per-agent gradients attached. Default layers: the second hidden layer (1)
    and the output layer (2); the first layer of ``fups_id`` also reads the agent ID.
    """
    result = train(method, gains, n_seeds=n_seeds, seed=seed, updates=warmup, batch=batch,
                   hidden=hidden, lr=lr, sigma=sigma, eval_every=max(warmup, 1), eval_batch=16)
    policy = result.policy
    env = GainReach(gains)
    grads = per_agent_gradients(policy, env, batch,
                                torch.Generator().manual_seed(30_000 + int(seed)), sigma, layers)
    return {i: agreement(policy.layers[i].weight[:, 0].detach(), g)
            for i, g in zip(layers, grads, strict=True)}


@dataclass
class CalibratedGGDA:
    """Split-half calibrated agreement between agents, one value per seed (eq-hps-calibrated).

    Each agent's gradient is computed twice, from two disjoint halves of the episodes. For each
    part (``tan``: tangential parts of all analysed rows, flattened into one vector per agent;
    ``rad``: the vector of radial magnitudes of those rows) the *between* statistic is the mean
    cosine between one agent's half and another agent's other half, the *within* statistic (the
    split-half ceiling) the mean cosine between an agent's own two halves, and the calibrated
    agreement their ratio: 1 when agents agree as well as an agent agrees with itself.
    """

    tan_between: np.ndarray
    tan_within: np.ndarray
    rad_between: np.ndarray
    rad_within: np.ndarray
    episode_return: np.ndarray | None = None   # mean return per agent and episode, per seed

    @property
    def tan(self) -> np.ndarray:
        return self.tan_between / self.tan_within

    @property
    def rad(self) -> np.ndarray:
        return self.rad_between / self.rad_within


def _cosine_matrix(a: torch.Tensor, b: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Cosines between agents' vectors: ``a``, ``b`` ``(N, S, D)`` -> ``(S, N, N)``."""
    a = a / torch.linalg.vector_norm(a, dim=-1, keepdim=True).clamp_min(eps)
    b = b / torch.linalg.vector_norm(b, dim=-1, keepdim=True).clamp_min(eps)
    return torch.einsum("ksd,lsd->skl", a, b)


def split_half_agreement(weights: list[torch.Tensor], first: list[torch.Tensor],
                         second: list[torch.Tensor]) -> CalibratedGGDA:
    """Calibrated agreement from per-layer rows ``(S, out, in)`` and two half-batch gradients.

    ``first`` and ``second`` hold, per layer, per-agent gradients ``(N, S, out, in)`` from
    disjoint halves of the episodes.
    """
    parts = []
    for grads in (first, second):
        rads, tans = [], []
        for w, g in zip(weights, grads, strict=True):
            r, tan = decompose(w.unsqueeze(0), g)
            rads.append(r)
            tans.append(tan.flatten(-2))
        parts.append((torch.cat(tans, -1), torch.cat(rads, -1)))
    n = first[0].shape[0]
    if n < 2:
        raise ValueError("agreement between agents needs at least two agents")
    off = ~torch.eye(n, dtype=torch.bool)
    out = []
    for i in range(2):
        c = _cosine_matrix(parts[0][i], parts[1][i])                   # (S, N, N)
        out.append(c[:, off].mean(-1))
        out.append(torch.diagonal(c, dim1=-2, dim2=-1).mean(-1))
    return CalibratedGGDA(*(x.detach().numpy() for x in out))


def calibrated_ggda(gains=None, *, angles=None, env=None, n_seeds: int = 32, seed: int = 0,
                    checkpoints=(10,), batch: int = 128, ggda_batch: int = 2048,
                    hidden: int = 32, lr: float = 3e-3, sigma: float = 0.1, layers=(1, 2),
                    method: str = "fups_id", one_pass: bool = True) -> dict[int, CalibratedGGDA]:
    """Train a shared policy and measure :class:`CalibratedGGDA` at each checkpoint (update).

    The task is ``GainReach(gains, angles=angles)``, or ``env`` (e.g. :class:`Spread`) when given.
    Training uses ``batch`` episodes per update (as :func:`train`); each measurement draws
    ``ggda_batch`` fresh episodes, splits them into two halves, and records the mean return
    (per agent and episode) of those episodes. ``one_pass`` gets all agents' gradients from one
    backward pass per half where the analysed layers are plain shared weights (``False``: one
    pass per agent and half, the reference the tests compare with).
    """
    checkpoints = sorted({_check_int(c, "checkpoint", 0) for c in checkpoints})
    if (env is None) == (gains is None):
        raise ValueError("give either gains or env")
    if env is None:
        env = GainReach(gains, angles=angles)
    policy = AgentPolicy(method, env.n_agents, n_seeds, hidden=hidden, obs_dim=env.obs_dim,
                         act_dim=env.act_dim, seed=seed)
    if policy.method == "nops":
        raise ValueError("no-sharing policies have no shared weights to decompose")
    optims = [SeedAdam(policy, lr)]
    gen = torch.Generator().manual_seed(10_000 + int(seed))
    measure_gen = torch.Generator().manual_seed(30_000 + int(seed))
    # the effective weight of a plain shared layer is its parameter: per-agent copies then give
    # all agents' gradients in one backward pass (the same numbers as one pass per agent)
    plain = [policy.layers[i] for i in layers]
    fast = one_pass and all(
        la.weight.shape[1] == 1 and la.log_scale is None and la.mask is None
        and la.film is None and la.hyper is None for la in plain)
    half = _check_int(ggda_batch, "ggda_batch", 2) // 2
    out = {}
    for update in range(checkpoints[-1] + 1):
        if update in checkpoints:
            params = [policy.layers[i].weight for i in layers]
            halves = []
            if fast:
                # one copy of each analysed weight per agent: agent k's surrogate depends only on
                # its own copy, so one backward pass of the sum gives every agent's gradient
                weights = policy.effective_weights()
                copies = [weights[i][0].detach().expand(-1, policy.n_agents, -1, -1).clone()
                          .requires_grad_() for i in layers]
                for i, c in zip(layers, copies, strict=True):
                    weights[i] = (c, weights[i][1])
                logps, rewards = rollout(policy, env, 2 * half, measure_gen, sigma, weights)
                for sl in (slice(0, half), slice(half, 2 * half)):
                    loss = agent_losses(logps[..., sl], rewards[..., sl]).sum()
                    grads = torch.autograd.grad(loss, copies, retain_graph=True)
                    halves.append([g.transpose(0, 1) for g in grads])
            else:
                logps, rewards = rollout(policy, env, 2 * half, measure_gen, sigma)
                for sl in (slice(0, half), slice(half, 2 * half)):
                    losses = agent_losses(logps[..., sl], rewards[..., sl])
                    per_agent = [torch.autograd.grad(losses[k], params, retain_graph=True)
                                 for k in range(policy.n_agents)]
                    halves.append([torch.stack([g[i][:, 0] for g in per_agent])
                                   for i in range(len(layers))])
            out[update] = split_half_agreement([p[:, 0].detach() for p in params], *halves)
            per_agent_return = rewards.sum(0) if rewards.dim() == 4 else rewards.sum(0)[:, None]
            out[update].episode_return = per_agent_return.mean((1, 2)).detach().numpy()
        if update == checkpoints[-1]:
            break
        policy_gradient_update(policy, env, batch, gen, sigma, optims)
    return out


def scale_gain_correlation(policy: AgentPolicy, gains) -> np.ndarray:
    """Per seed: correlation across agents of the output layer's mean log scale and ``-log gain``.

    For HPS the output of agent ``k`` is ``s_k * (U h) + b``; the oracle action is
    ``(goal - pos) / gain_k``, so ``log s_k`` should follow ``-log gain_k`` (eq-hps-oracle).
    """
    if policy.method not in _AGENT_SCALES:
        raise ValueError(f"method {policy.method!r} has no agent scales")
    gains = check_gains(gains).numpy()
    if gains.size < 2 or np.ptp(gains) == 0:
        raise ValueError("a correlation needs at least two different gains")
    log_s = policy.layers[-1].log_scale.detach().mean(-1).numpy()     # (S, N)
    target = -np.log(gains)
    return np.array([np.corrcoef(row, target)[0, 1] for row in log_s])


# --- linear policies: the scale conflict in closed form ---------------------------------------


def linear_policy_value(gains, scales, horizon: int = 8) -> float:
    """Normalised return of the linear policies ``a_k = c_k o_k`` (eq-hps-linear-value).

    Each step multiplies agent ``k``'s distance to its goal by ``|1 - gain_k c_k|``; with the zero
    policy's return as the 0 point and the oracle's (0) as 1, the normalised return is
    ``1 - (1/(N T)) sum_k sum_{t=1..T} |1 - gain_k c_k|^t``. ``scales`` is one number (a shared
    scale) or one per agent.
    """
    gains = check_gains(gains).numpy()
    scales = np.broadcast_to(np.asarray(scales, dtype=float), gains.shape)
    if not np.isfinite(scales).all():
        raise ValueError("scales must be finite")
    horizon = _check_int(horizon, "horizon", 1)
    factor = np.abs(1 - gains * scales)
    powers = factor[:, None] ** np.arange(1, horizon + 1)[None, :]
    return float(1 - powers.sum() / (gains.size * horizon))


def best_shared_scale(gains, horizon: int = 8) -> tuple[float, float]:
    """The single scale ``c`` that maximises :func:`linear_policy_value` and its value.

    The objective is convex in ``c`` (a sum of powers of ``|1 - gain_k c|``), so a bounded scalar
    search on ``[0, 2 / min gain]`` finds the optimum (eq-hps-compromise).
    """
    from scipy.optimize import minimize_scalar

    gains = check_gains(gains).numpy()
    res = minimize_scalar(lambda c: -linear_policy_value(gains, c, horizon),
                          bounds=(0.0, 2.0 / gains.min()), method="bounded",
                          options={"xatol": 1e-10})
    return float(res.x), float(-res.fun)
