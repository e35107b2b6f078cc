"""Hyperspherical parameter sharing (HPS) for cooperative multi-agent policy gradients.

Everything here is a CPU-scale reconstruction of the mechanism described in the abstract of
*HPS: Hyperspherical Parameter Sharing for Efficient Multi-Agent Reinforcement Learning*
(ICML 2026); the layer, the scale generator, the environment and the statistics are ours.

* :class:`GainReach` is a vectorised cooperative task (torch): every agent must move to its own
  goal, all agents want the same *direction* of action, but hidden actuator gains make the right
  *scale* differ between agents (eq-hps-oracle). :class:`GainReachParallelEnv` wraps one copy of
  it in PettingZoo's parallel API.
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

METHODS = ("nops", "fups", "fups_id", "hps", "scale_only", "sphere_only")
"""Sharing modes: no sharing, full sharing, full sharing + agent ID, HPS and its two ablations."""

LABELS = {"nops": "NoPS", "fups": "FuPS", "fups_id": "FuPS+ID", "hps": "HPS",
          "scale_only": "scale-only", "sphere_only": "sphere-only"}
"""Display names of :data:`METHODS`."""

CONFLICT_GAINS = (0.25, 0.5, 2.0, 4.0)
"""Hidden actuator gains of the conflict variant: the right action scales differ by 16x."""

_SPHERE = {"hps", "sphere_only"}
_AGENT_SCALES = {"hps", "scale_only"}
_SCALED = {"hps", "scale_only", "sphere_only"}


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


# --- environment ------------------------------------------------------------------------------


class GainReach:
    """Cooperative reaching with hidden actuator gains, vectorised over seeds and episodes.

    State: positions and goals of ``N`` agents in the plane, drawn uniformly from ``[-1, 1]^2``.
    Agent ``k`` observes ``goal_k - pos_k`` and moves by ``gain_k * action_k``; every agent gets
    the team reward ``-(1/N) sum_k ||goal_k - pos_k||`` after the move. The oracle plays
    ``(goal - pos) / gain`` (eq-hps-oracle) and earns 0; the zero policy earns
    ``-T`` times the mean initial distance. Tensors are shaped ``(S, N, B, ...)``: seeds, agents,
    episodes.
    """

    obs_dim = 2
    act_dim = 2

    def __init__(self, gains, horizon: int = 8):
        self.gains = check_gains(gains).float()
        self.n_agents = self.gains.numel()
        self.horizon = _check_int(horizon, "horizon", 1)

    def reset(self, n_seeds: int, batch: int, generator: torch.Generator) -> torch.Tensor:
        """Draw ``batch`` episodes per seed; return the observations, shape ``(S, N, B, 2)``."""
        shape = (_check_int(n_seeds, "n_seeds", 1), self.n_agents,
                 _check_int(batch, "batch", 1), 2)
        self.pos = 2 * torch.rand(shape, generator=generator) - 1
        self.goal = 2 * torch.rand(shape, generator=generator) - 1
        self.t = 0
        return self.goal - self.pos

    def distances(self) -> torch.Tensor:
        """Distance of each agent to its goal, shape ``(S, N, B)``."""
        return torch.linalg.vector_norm(self.goal - self.pos, dim=-1)

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """Apply ``actions`` ``(S, N, B, 2)``; return observations, team reward ``(S, B)``, done."""
        if actions.shape != self.pos.shape:
            raise ValueError(f"actions must have shape {tuple(self.pos.shape)}, "
                             f"got {tuple(actions.shape)}")
        self.pos = self.pos + self.gains.view(1, -1, 1, 1) * actions
        self.t += 1
        reward = -self.distances().mean(dim=1)
        return self.goal - self.pos, reward, self.t >= self.horizon

    def oracle_actions(self) -> torch.Tensor:
        """The optimal actions ``(goal - pos) / gain`` of eq-hps-oracle."""
        return (self.goal - self.pos) / self.gains.view(1, -1, 1, 1)


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
    log_scale: torch.Tensor | None  # (S, N or 1, out) or None


class AgentPolicy(nn.Module):
    """Gaussian policy for ``N`` agents and ``S`` independent seeds in one sharing ``method``.

    Layer ``l`` of agent ``k`` computes ``h_out = act(W_k h_in + b)``; the modes differ in ``W_k``:

    * ``nops``: ``W_k`` and ``b_k`` separate for each agent;
    * ``fups``: one ``W`` for all; ``fups_id``: the same, with a one-hot agent ID appended to the
      observation;
    * ``hps``: ``W_k = diag(s_k) U`` with ``U``'s rows on the unit sphere (eq-hps-layer) and
      agent scales ``s_k = exp(log_s_k)`` (the scale generator: one embedding per agent);
    * ``scale_only``: ``W_k = diag(s_k) W`` with Euclidean shared ``W``;
    * ``sphere_only``: ``W = diag(s) U``, sphere rows with one scale vector for all agents.

    Every mode starts from the *same* draw of PyTorch's default Linear initialisation (per seed;
    per agent for ``nops``), and the scaled modes start with ``s`` equal to the initial row norms
    (``scale_only``: ``s = 1``), so at initialisation ``fups``, ``hps``, ``scale_only`` and
    ``sphere_only`` compute the same function. The action mean is the last layer's output
    (no activation); the action noise is fixed.
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
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
            bound = 1.0 / math.sqrt(fan_in)
            w = (2 * torch.rand(n_seeds, groups, fan_out, fan_in, generator=gen) - 1) * bound
            b = (2 * torch.rand(n_seeds, groups, fan_out, generator=gen) - 1) * bound
            norms = torch.linalg.vector_norm(w, dim=-1)
            log_scale = None
            if method in _SPHERE:
                weight = geoopt.ManifoldParameter(unit_rows(w), manifold=geoopt.Sphere())
                self.sphere_params.append(weight)
                scale_groups = n_agents if method in _AGENT_SCALES else 1
                log_scale = nn.Parameter(norms.log().expand(-1, scale_groups, -1).clone())
            else:
                weight = nn.Parameter(w)
                self.euclid_params.append(weight)
                if method == "scale_only":
                    log_scale = nn.Parameter(torch.zeros(n_seeds, n_agents, fan_out))
            bias = nn.Parameter(b)
            self.euclid_params.append(bias)
            if log_scale is not None:
                self.euclid_params.append(log_scale)
            self.layers.append(_Layer(weight, bias, log_scale))

    def agent_weights(self, index: int) -> torch.Tensor:
        """Effective weights ``W_k`` of layer ``index``, shape ``(S, N or 1, out, in)``."""
        layer = self.layers[index]
        if layer.log_scale is None:
            return layer.weight
        return layer.log_scale.exp().unsqueeze(-1) * layer.weight

    def effective_weights(self) -> list[torch.Tensor]:
        """``W_k`` of every layer (:meth:`agent_weights`), to reuse over the steps of a rollout."""
        return [self.agent_weights(i) for i in range(len(self.layers))]

    def forward(self, obs: torch.Tensor, weights: list[torch.Tensor] | None = None,
                ) -> torch.Tensor:
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
        for index, (layer, w) in enumerate(zip(self.layers, weights, strict=True)):
            h = h @ w.transpose(-1, -2) + layer.bias.unsqueeze(-2)
            if index < last:
                h = torch.tanh(h)
        return h

    def parameter_count(self) -> int:
        """Trainable numbers per seed (backbone, biases and scale generator together)."""
        return sum(p.numel() for p in self.parameters()) // self.n_seeds

    def renormalise(self) -> None:
        """Put sphere rows back on the unit sphere exactly (guards against float drift)."""
        with torch.no_grad():
            for p in self.sphere_params:
                p.copy_(unit_rows(p))


# --- learning ---------------------------------------------------------------------------------


def rollout(policy: AgentPolicy, env: GainReach, batch: int, generator: torch.Generator,
            sigma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample episodes; return log-probabilities ``(T, S, N, B)`` and team rewards ``(T, S, B)``."""
    obs = env.reset(policy.n_seeds, batch, generator)
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
    """
    returns = rewards.flip(0).cumsum(0).flip(0)
    adv = returns - returns.mean(dim=-1, keepdim=True)
    return -(logps * adv.unsqueeze(2)).mean(dim=-1).sum(dim=0).sum(dim=0)


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


def train(method: str, gains, *, n_seeds: int = 4, seed: int = 0, updates: int = 100,
          batch: int = 256, hidden: int = 32, lr: float = 3e-3, sphere_lr: float | None = None,
          sigma: float = 0.1, horizon: int = 8, eval_every: int = 10, eval_batch: int = 512,
          ) -> TrainResult:
    """Train ``n_seeds`` independent policies of one sharing ``method`` with REINFORCE.

    Every method gets the same environment draws (``seed``), the same number of updates and the
    same learning rates. ``sphere_lr`` is the Riemannian Adam rate of sphere rows (``lr`` scaled by
    the square root of the fan-in when ``None``: geoopt normalises the second moment per row, so
    this matches the length of an elementwise Adam step on a row).
    """
    import time

    updates = _check_int(updates, "updates", 0)
    eval_every = _check_int(eval_every, "eval_every", 1)
    for name, value in (("lr", lr), ("sigma", sigma)) + (
            (("sphere_lr", sphere_lr),) if sphere_lr is not None else ()):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite positive number, got {value!r}")
    env = GainReach(gains, horizon)
    policy = AgentPolicy(method, env.n_agents, n_seeds, hidden=hidden, seed=seed)
    if sphere_lr is None:
        optims = [torch.optim.Adam(policy.euclid_params, lr=lr)]
        for p in policy.sphere_params:
            optims.append(geoopt.optim.RiemannianAdam([p], lr=lr * math.sqrt(p.shape[-1])))
    else:
        optims = make_optimizers(policy, lr, sphere_lr)
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
        logps, rewards = rollout(policy, env, batch, gen, sigma)
        loss = agent_losses(logps, rewards).sum()
        for opt in optims:
            opt.zero_grad()
        loss.backward()
        for opt in optims:
            opt.step()
        policy.renormalise()
    curve = np.array(curve)
    return TrainResult(method, steps, curve, curve[-1], policy, time.process_time() - start)


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
