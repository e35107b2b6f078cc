"""Gymnasium's ``Pendulum-v1`` in torch, parametric controllers and offline data.

The dynamics copy ``gymnasium.envs.classic_control.PendulumEnv.step`` (gymnasium 1.4.0) term by
term, vectorised over any leading batch shape: the state is ``(theta, theta_dot)`` in the last
dimension, the torque is clipped to ``[-2, 2]``, the reward is computed from the state *before*
the step and the clipped torque (Eq. ``eq-dt2-pendulum``).

The chapter adds one knob to gymnasium's system, an actuator nonlinearity (Eq.
``eq-dt2-actuator``): the torque that reaches the joint is
``(1 - cubic) u + cubic * 2 (u / 2)^3``. ``cubic = 0`` is gymnasium's pendulum; ``cubic = 1`` is
the one-dimensional counterexample's cubic response, scaled to the torque range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

GRAVITY = 10.0
MASS = 1.0
LENGTH = 1.0
DT = 0.05
MAX_SPEED = 8.0
MAX_TORQUE = 2.0
RESET_HIGH = (math.pi, 1.0)
"""Reset box of ``Pendulum-v1``: ``theta ~ U[-pi, pi]``, ``theta_dot ~ U[-1, 1]``."""

GAIN_LOW = (-12.0, -3.0, 0.0)
GAIN_HIGH = (2.0, 0.5, 1.5)
"""Box of controller gains ``(k1, k2, k3)`` from which candidate policies are drawn."""


def _check_state(state: torch.Tensor) -> torch.Tensor:
    if not isinstance(state, torch.Tensor):
        raise TypeError(f"state must be a torch tensor, got {type(state).__name__}")
    if state.shape[-1:] != (2,):
        raise ValueError(f"state must end in a dimension of size 2 (theta, theta_dot), "
                         f"got shape {tuple(state.shape)}")
    return state


def angle_normalize(theta: torch.Tensor) -> torch.Tensor:
    """Wrap an angle into ``[-pi, pi)``, as gymnasium's ``angle_normalize``."""
    return torch.remainder(theta + math.pi, 2 * math.pi) - math.pi


def pendulum_reward(state: torch.Tensor, torque: torch.Tensor) -> torch.Tensor:
    """Reward of ``Pendulum-v1`` for a state and a (clipped) torque, Eq. ``eq-dt2-pendulum``."""
    state = _check_state(state)
    u = torch.clamp(torque, -MAX_TORQUE, MAX_TORQUE)
    theta, theta_dot = state[..., 0], state[..., 1]
    return -(angle_normalize(theta) ** 2 + 0.1 * theta_dot**2 + 0.001 * u**2)


def check_cubic(cubic: float) -> float:
    """Validate the actuator nonlinearity ``cubic`` in ``[0, 1]``."""
    if isinstance(cubic, bool) or not isinstance(cubic, (int, float, np.floating)):
        raise TypeError(f"cubic must be a real number, got {type(cubic).__name__}")
    cubic = float(cubic)
    if not 0.0 <= cubic <= 1.0:
        raise ValueError(f"cubic must lie in [0, 1], got {cubic}")
    return cubic


def actuator(torque: torch.Tensor, cubic: float = 0.0) -> torch.Tensor:
    """Torque delivered to the joint for a commanded (clipped) torque, Eq. ``eq-dt2-actuator``:
    ``(1 - cubic) u + cubic * 2 (u / 2)^3``; both ends of the range are unchanged."""
    cubic = check_cubic(cubic)
    u = torch.clamp(torque, -MAX_TORQUE, MAX_TORQUE)
    if cubic == 0.0:
        return u
    return (1 - cubic) * u + cubic * MAX_TORQUE * (u / MAX_TORQUE) ** 3


def pendulum_step(state: torch.Tensor, torque: torch.Tensor,
                  cubic: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of ``Pendulum-v1``: ``(next_state, reward)``, Eq. ``eq-dt2-pendulum``, with the
    actuator of Eq. ``eq-dt2-actuator`` (``cubic = 0``: gymnasium's pendulum exactly).

    ``state`` has shape ``(..., 2)`` and ``torque`` the leading shape ``(...)``. The angle is not
    wrapped, exactly as in gymnasium (only the reward and the observation use the wrapped angle).
    """
    state = _check_state(state)
    if torque.shape != state.shape[:-1]:
        raise ValueError(f"torque shape {tuple(torque.shape)} does not match the state's "
                         f"leading shape {tuple(state.shape[:-1])}")
    u = torch.clamp(torque, -MAX_TORQUE, MAX_TORQUE)
    theta, theta_dot = state[..., 0], state[..., 1]
    reward = -(angle_normalize(theta) ** 2 + 0.1 * theta_dot**2 + 0.001 * u**2)
    new_dot = theta_dot + (3 * GRAVITY / (2 * LENGTH) * torch.sin(theta)
                           + 3.0 / (MASS * LENGTH**2) * actuator(u, cubic)) * DT
    new_dot = torch.clamp(new_dot, -MAX_SPEED, MAX_SPEED)
    new_theta = theta + new_dot * DT
    return torch.stack([new_theta, new_dot], dim=-1), reward


def reset_states(n: int, rng: np.random.Generator) -> torch.Tensor:
    """``n`` start states from the reset distribution of ``Pendulum-v1`` (float64)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    high = np.array(RESET_HIGH)
    return torch.from_numpy(rng.uniform(-high, high, size=(int(n), 2)))


# --- Policies -----------------------------------------------------------------------------------


def check_gains(gains: torch.Tensor, batched: bool = False) -> torch.Tensor:
    """Validate a ``(P, 3)`` tensor of controller gains (``(M, P, 3)``, one set per model, when
    ``batched``); an empty policy set is an error."""
    if not isinstance(gains, torch.Tensor):
        raise TypeError(f"gains must be a torch tensor, got {type(gains).__name__}")
    ndims = (2, 3) if batched else (2,)
    if gains.ndim not in ndims or gains.shape[-1] != 3:
        shape = "(P, 3) or (M, P, 3)" if batched else "(P, 3)"
        raise ValueError(f"gains must have shape {shape}, got {tuple(gains.shape)}")
    if gains.shape[-2] == 0:
        raise ValueError("the policy set is empty: give at least one policy")
    if not torch.isfinite(gains).all():
        raise ValueError("gains contain NaN or infinite values")
    return gains


def policy_torque(gains: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """Torques of ``P`` controllers, Eq. ``eq-dt2-policy``.

    ``gains`` has shape ``(P, 3)`` or ``(M, P, 3)``; ``state`` has shape ``(..., P, B, 2)``
    (policy ``p`` acts on the states ``[..., p, :, :]``). Returns ``(..., P, B)``:
    ``clip(k1 sin(theta) + k2 theta_dot + k3 (1 - cos(theta)) tanh(2 theta_dot), -2, 2)``.
    """
    gains = check_gains(gains, batched=True)
    state = _check_state(state)
    if state.ndim < gains.ndim + 1 or state.shape[-3] != gains.shape[-2]:
        raise ValueError(f"state must have shape (..., P={gains.shape[-2]}, B, 2), "
                         f"got {tuple(state.shape)}")
    k = gains.to(state.dtype).unsqueeze(-2)  # (P, 1, 3): broadcast over B
    theta, theta_dot = state[..., 0], state[..., 1]
    u = (k[..., 0] * torch.sin(theta) + k[..., 1] * theta_dot
         + k[..., 2] * (1 - torch.cos(theta)) * torch.tanh(2 * theta_dot))
    return torch.clamp(u, -MAX_TORQUE, MAX_TORQUE)


def sample_gains(n: int, rng: np.random.Generator) -> torch.Tensor:
    """``n`` controllers with gains uniform in the box ``GAIN_LOW``..``GAIN_HIGH`` (float64)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    return torch.from_numpy(rng.uniform(GAIN_LOW, GAIN_HIGH, size=(int(n), 3)))


# --- Rollouts and offline data ------------------------------------------------------------------


def check_horizon(horizon: int) -> int:
    if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)):
        raise TypeError(f"horizon must be an integer, got {type(horizon).__name__}")
    if horizon < 1:
        raise ValueError(f"horizon must be at least 1, got {horizon}")
    return int(horizon)


def check_gamma(gamma: float) -> float:
    gamma = float(gamma)
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"gamma must lie in (0, 1], got {gamma}")
    return gamma


def true_values(gains: torch.Tensor, starts: torch.Tensor, horizon: int,
                gamma: float, cubic: float = 0.0) -> torch.Tensor:
    """Monte Carlo values of ``P`` policies in the true pendulum, Eq. ``eq-dt2-value``.

    Every policy starts from every state in ``starts`` (shape ``(B, 2)``); the value is the mean
    over starts of the discounted ``horizon``-step return. The dynamics and policies are
    deterministic, so the only Monte Carlo error is over start states. Returns ``(P,)``.
    """
    gains = check_gains(gains)
    horizon, gamma = check_horizon(horizon), check_gamma(gamma)
    cubic = check_cubic(cubic)
    starts = _check_state(starts)
    if starts.ndim != 2 or starts.shape[0] == 0:
        raise ValueError(f"starts must have shape (B, 2) with B >= 1, got {tuple(starts.shape)}")
    state = starts.to(torch.float64).unsqueeze(0).expand(gains.shape[0], -1, -1)
    total = torch.zeros(state.shape[:-1], dtype=torch.float64)
    for t in range(horizon):
        state, reward = pendulum_step(state, policy_torque(gains, state), cubic)
        total = total + gamma**t * reward
    return total.mean(dim=-1)


@dataclass(frozen=True)
class OfflineData:
    """Transitions ``(s, a, r, s')`` from behaviour policies and the episodes' start states."""

    states: torch.Tensor       # (n, 2), angle wrapped into [-pi, pi)
    actions: torch.Tensor      # (n,), clipped torques
    rewards: torch.Tensor      # (n,)
    next_states: torch.Tensor  # (n, 2), angle continuous with ``states`` (not wrapped)
    starts: torch.Tensor       # (episodes, 2)

    def __post_init__(self):
        check_offline(self)

    @property
    def size(self) -> int:
        return int(self.states.shape[0])


def check_offline(data: OfflineData) -> OfflineData:
    """Raise ``ValueError`` for offline data with NaN/inf values or inconsistent shapes."""
    n = data.states.shape[0]
    if n == 0:
        raise ValueError("the offline data set is empty")
    shapes = {"states": (n, 2), "actions": (n,), "rewards": (n,), "next_states": (n, 2)}
    for name, shape in shapes.items():
        value = getattr(data, name)
        if tuple(value.shape) != shape:
            raise ValueError(f"offline {name} must have shape {shape}, got {tuple(value.shape)}")
    for name in ("states", "actions", "rewards", "next_states", "starts"):
        if not torch.isfinite(getattr(data, name)).all():
            raise ValueError(f"offline data contain NaN or infinite values in {name}")
    return data


def collect_offline(behaviour: torch.Tensor, episodes: int, steps: int, noise: float,
                    rng: np.random.Generator, cubic: float = 0.0,
                    explore: float = 0.0, max_command: float = MAX_TORQUE,
                    full_share: float = 0.0) -> OfflineData:
    """Offline data from the true pendulum (actuator ``cubic``): each episode picks one behaviour
    controller at random and adds Gaussian torque noise of standard deviation ``noise``; at each
    step, with probability ``explore``, the torque is instead uniform on ``[-max_command,
    max_command]`` (the counterexample's behaviour distribution). Every logged command is
    clipped to ``[-max_command, max_command]`` (``max_command < 2``: gentle logging, which never
    sees the torques the candidates use). Finally, with probability ``full_share`` per step, the
    command is uniform on the whole range ``[-2, 2]`` (a mixture: mostly gentle, a few full
    commands, so that a model-free estimator sees what full commands do). Starts come from the
    reset distribution."""
    behaviour = check_gains(behaviour)
    steps = check_horizon(steps)
    if isinstance(episodes, bool) or not isinstance(episodes, (int, np.integer)) or episodes < 1:
        raise ValueError(f"episodes must be a positive integer, got {episodes!r}")
    if not noise >= 0:
        raise ValueError(f"noise must be non-negative, got {noise}")
    cubic = check_cubic(cubic)
    if not 0.0 <= explore <= 1.0:
        raise ValueError(f"explore must lie in [0, 1], got {explore}")
    if not 0.0 < max_command <= MAX_TORQUE:
        raise ValueError(f"max_command must lie in (0, {MAX_TORQUE}], got {max_command}")
    if not 0.0 <= full_share <= 1.0:
        raise ValueError(f"full_share must lie in [0, 1], got {full_share}")
    starts = reset_states(episodes, rng)
    which = torch.from_numpy(rng.integers(0, behaviour.shape[0], size=episodes))
    gains = behaviour[which]  # one controller per episode: treat episodes as P = episodes, B = 1
    state = starts.unsqueeze(1)  # (E, 1, 2)
    records = []
    for _ in range(steps):
        u = policy_torque(gains, state)
        u = torch.clamp(u + noise * torch.from_numpy(rng.standard_normal(u.shape)),
                        -max_command, max_command)
        uniform = torch.from_numpy(rng.uniform(-max_command, max_command, u.shape))
        u = torch.where(torch.from_numpy(rng.random(u.shape) < explore), uniform, u)
        if full_share > 0:  # no extra draws without the mixture: the stream stays the same
            full = torch.from_numpy(rng.uniform(-MAX_TORQUE, MAX_TORQUE, u.shape))
            u = torch.where(torch.from_numpy(rng.random(u.shape) < full_share), full, u)
        wrapped = torch.stack([angle_normalize(state[..., 0]), state[..., 1]], dim=-1)
        nxt, reward = pendulum_step(wrapped, u, cubic)
        records.append((wrapped, u, reward, nxt))
        state = nxt
    cat = [torch.cat([r[i].reshape(-1, *r[i].shape[2:]) for r in records]) for i in range(4)]
    return OfflineData(cat[0], cat[1], cat[2], cat[3], starts)
