"""Digital twins of the pendulum, their rollout values, the DT² loss and the decision metrics.

A *batch of models* is trained at once: every parameter has a leading dimension ``M`` (one model
per replicate and per ranking weight), the losses of the models are summed, and Adam's update is
elementwise, so each model follows exactly the trajectory it would follow alone (gradient
clipping is applied per model, never across models).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats
from torch import nn

from icml26.decision_twins.env import (
    MAX_SPEED,
    MAX_TORQUE,
    angle_normalize,
    check_gains,
    check_gamma,
    check_horizon,
    pendulum_reward,
    policy_torque,
)


class BatchedTwin(nn.Module):
    """Base class: ``M`` twins, each mapping ``(state, torque)`` to a next state.

    Subclasses define :meth:`features` (inputs to the model) and the map to a *scaled* state
    change; :meth:`step` un-scales the change with ``delta_scale`` (the per-dimension standard
    deviation of ``s' - s`` in the offline data) and wraps the angle.
    """

    def __init__(self, n_models: int, delta_scale: torch.Tensor):
        super().__init__()
        if isinstance(n_models, bool) or not isinstance(n_models, int) or n_models < 1:
            raise ValueError(f"n_models must be a positive integer, got {n_models!r}")
        self.n_models = n_models
        self.register_buffer("delta_scale", torch.as_tensor(delta_scale, dtype=torch.float32))

    def scaled_delta(self, state: torch.Tensor, torque: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def step(self, state: torch.Tensor, torque: torch.Tensor) -> torch.Tensor:
        """Next state for states ``(M, N, 2)`` and torques ``(M, N)``; angle wrapped."""
        nxt = state + self.scaled_delta(state, torque) * self.delta_scale
        return torch.stack([angle_normalize(nxt[..., 0]), nxt[..., 1]], dim=-1)


class LinearTwin(BatchedTwin):
    """Limited capacity: the state change is linear in ``(sin theta, theta_dot, u, 1)``, 8
    parameters. Gravity is inside the class (gymnasium's pendulum, ``cubic = 0``, is one of its
    members up to the speed clip); the cubic actuator of Eq. ``eq-dt2-actuator`` is not, because
    the twin is linear in the torque ``u``."""

    def __init__(self, n_models: int, delta_scale: torch.Tensor):
        super().__init__(n_models, delta_scale)
        self.weight = nn.Parameter(torch.zeros(n_models, 4, 2))

    @staticmethod
    def features(state: torch.Tensor, torque: torch.Tensor) -> torch.Tensor:
        theta, theta_dot = state[..., 0], state[..., 1]
        return torch.stack([torch.sin(theta), theta_dot / MAX_SPEED, torque / MAX_TORQUE,
                            torch.ones_like(theta)], dim=-1)

    def scaled_delta(self, state, torque):
        return torch.bmm(self.features(state, torque), self.weight)

    @torch.no_grad()
    def fit_least_squares(self, states: torch.Tensor, actions: torch.Tensor,
                          next_states: torch.Tensor) -> None:
        """Set every model to the one-step MSE minimiser (Eq. ``eq-dt2-mse``) of its data.

        Shapes ``(M, n, 2)``, ``(M, n)``, ``(M, n, 2)``: a closed-form least-squares solve.
        """
        X = self.features(states.float(), actions.float())
        Y = (next_states - states).float() / self.delta_scale
        self.weight.copy_(torch.linalg.lstsq(X, Y).solution)


class MLPTwin(BatchedTwin):
    """Expressive: a ``4 -> hidden -> hidden -> 2`` tanh MLP on
    ``(cos theta, sin theta, theta_dot / 8, u / 2)``."""

    def __init__(self, n_models: int, delta_scale: torch.Tensor, hidden: int = 32,
                 generator: torch.Generator | None = None):
        super().__init__(n_models, delta_scale)
        sizes = [4, hidden, hidden, 2]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
            w = torch.randn(n_models, fan_in, fan_out, generator=generator) / math.sqrt(fan_in)
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(torch.zeros(n_models, 1, fan_out)))

    @staticmethod
    def features(state, torque):
        theta, theta_dot = state[..., 0], state[..., 1]
        return torch.stack([torch.cos(theta), torch.sin(theta), theta_dot / MAX_SPEED,
                            torque / MAX_TORQUE], dim=-1)

    def scaled_delta(self, state, torque):
        h = self.features(state, torque)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = torch.baddbmm(b, h, w)
            if i < last:
                h = torch.tanh(h)
        return h


def twin_values(twin: BatchedTwin, gains: torch.Tensor, starts: torch.Tensor, horizon: int,
                gamma: float) -> torch.Tensor:
    """Rollout values of ``P`` policies in ``M`` twins, Eq. ``eq-dt2-twin-value``.

    ``gains`` has shape ``(P, 3)`` (the same policies for every model) or ``(M, P, 3)``.
    ``starts`` has shape ``(M, B, 2)`` (each model its own start states) or ``(B, 2)``. The reward
    is the known reward of the real system applied to the twin's states. Differentiable in the
    twin's parameters (backpropagation through time). Returns ``(M, P)``. Cost ``O(M P B T)``
    twin evaluations.
    """
    gains = check_gains(gains, batched=True)
    horizon, gamma = check_horizon(horizon), check_gamma(gamma)
    M, P = twin.n_models, gains.shape[-2]
    if gains.ndim == 3 and gains.shape[0] != M:
        raise ValueError(f"batched gains need one policy set per model ({M}), got {gains.shape[0]}")
    if starts.ndim == 2:
        starts = starts.unsqueeze(0).expand(M, -1, -1)
    if starts.ndim != 3 or starts.shape[0] != M or starts.shape[-1] != 2 or starts.shape[1] == 0:
        raise ValueError(f"starts must have shape (B, 2) or (M={M}, B, 2), got "
                         f"{tuple(starts.shape)}")
    B = starts.shape[1]
    state = starts.float().unsqueeze(1).expand(M, P, B, 2)
    k = gains.float()
    total = torch.zeros(M, P, B)
    for t in range(horizon):
        u = policy_torque(k, state)
        total = total + gamma**t * pendulum_reward(state, u)
        state = twin.step(state.reshape(M, P * B, 2), u.reshape(M, P * B)).reshape(M, P, B, 2)
        state = torch.stack([state[..., 0], state[..., 1].clamp(-MAX_SPEED, MAX_SPEED)], dim=-1)
    return total.mean(dim=-1)


# --- The DT² objective ------------------------------------------------------------------------


def pair_temperature(reference: torch.Tensor) -> torch.Tensor:
    """Median absolute gap ``|V_i - V_j|`` between the reference values of each model: the
    temperature ``tau`` of Eq. ``eq-dt2-rank`` (one per model, shape ``(M,)``)."""
    gaps = (reference.unsqueeze(-1) - reference.unsqueeze(-2)).abs()
    i, j = torch.triu_indices(reference.shape[-1], reference.shape[-1], offset=1)
    return gaps[..., i, j].median(dim=-1).values.clamp_min(1e-8)


def ranking_loss(predicted: torch.Tensor, reference: torch.Tensor,
                 temperature: torch.Tensor | float) -> torch.Tensor:
    """Pairwise logistic ranking loss of Eq. ``eq-dt2-rank``, one value per model.

    Over the ordered pairs ``(i, j)`` with ``reference_i > reference_j``, the mean of
    ``softplus(-(predicted_i - predicted_j) / tau)``. Shapes ``(M, P)``; returns ``(M,)``.
    """
    if predicted.shape != reference.shape or predicted.ndim != 2:
        raise ValueError(f"predicted and reference must both have shape (M, P), got "
                         f"{tuple(predicted.shape)} and {tuple(reference.shape)}")
    if predicted.shape[1] < 2:
        raise ValueError("ranking needs at least two policies")
    if not torch.isfinite(reference).all():
        raise ValueError("reference values contain NaN or infinite values")
    tau = torch.as_tensor(temperature, dtype=predicted.dtype)
    tau = tau.reshape(-1, 1, 1) if tau.ndim == 1 else tau
    if (tau <= 0).any():
        raise ValueError("the temperature must be positive")
    better = (reference.unsqueeze(-1) > reference.unsqueeze(-2)).to(predicted.dtype)
    margin = (predicted.unsqueeze(-1) - predicted.unsqueeze(-2)) / tau
    pairs = better.sum(dim=(-1, -2)).clamp_min(1.0)
    return (nn.functional.softplus(-margin) * better).sum(dim=(-1, -2)) / pairs


def one_step_loss(twin: BatchedTwin, states: torch.Tensor, actions: torch.Tensor,
                  next_states: torch.Tensor) -> torch.Tensor:
    """Mean squared one-step error of each model on scaled state changes, Eq. ``eq-dt2-mse``.

    Shapes ``(M, n, 2)``, ``(M, n)``, ``(M, n, 2)``; returns ``(M,)``. The target is the change
    of the *unwrapped* angle, so the error is not inflated by the wrap at ``pm pi``.
    """
    if not (torch.isfinite(states).all() and torch.isfinite(actions).all()
            and torch.isfinite(next_states).all()):
        raise ValueError("transitions contain NaN or infinite values")
    pred = twin.scaled_delta(states.float(), actions.float())
    target = (next_states - states).float() / twin.delta_scale
    return ((pred - target) ** 2).mean(dim=(-1, -2))


def check_weights(weights) -> torch.Tensor:
    """Validate ranking weights ``lambda >= 0`` (one per model)."""
    weights = torch.as_tensor(weights, dtype=torch.float32).reshape(-1)
    if not torch.isfinite(weights).all():
        raise ValueError("ranking weights must be finite")
    if (weights < 0).any():
        raise ValueError(f"ranking weights must be non-negative, got {weights.tolist()}")
    return weights


@dataclass
class TrainingLog:
    """Per-step mean losses over models: one-step term and ranking term."""

    one_step: list[float]
    ranking: list[float]


def _clip_per_model(params: list[torch.Tensor], max_norm: float) -> None:
    norms = torch.zeros(params[0].shape[0])
    for p in params:
        if p.grad is not None:
            norms = norms + p.grad.reshape(p.shape[0], -1).pow(2).sum(dim=1)
    scale = (max_norm / (norms.sqrt() + 1e-12)).clamp(max=1.0)
    for p in params:
        if p.grad is not None:
            p.grad.mul_(scale.reshape(-1, *([1] * (p.grad.ndim - 1))))


def train_dt2(twin: BatchedTwin, transitions: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
              gains: torch.Tensor, reference: torch.Tensor, weights, starts: torch.Tensor, *,
              horizon: int, gamma: float, steps: int, lr: float = 3e-3, batch: int = 512,
              n_starts: int = 32, max_norm: float = 1.0,
              generator: torch.Generator | None = None) -> TrainingLog:
    """Train ``M`` twins on the DT² loss of Eq. ``eq-dt2-loss``:
    one-step MSE + ``lambda_m`` x pairwise ranking loss of rollout values against ``reference``.

    ``transitions`` are ``(states, actions, next_states)`` with shapes ``(M, n, 2)``, ``(M, n)``,
    ``(M, n, 2)``; ``reference`` (``(M, P)``) are the values to rank by (FQE, or the truth for the
    oracle); ``weights`` the ``lambda`` of each model (``0`` gives the conventional twin trained
    for the same number of steps); ``starts`` ``(M, B, 2)`` the start states, of which
    ``n_starts`` are resampled each step. Cost per step: ``O(M (batch + P n_starts T))``.
    """
    gains = check_gains(gains, batched=True)
    horizon, gamma = check_horizon(horizon), check_gamma(gamma)
    weights = check_weights(weights)
    M = twin.n_models
    if weights.shape[0] != M:
        raise ValueError(f"need one ranking weight per model ({M}), got {weights.shape[0]}")
    if reference.shape != (M, gains.shape[-2]):
        raise ValueError(f"reference must have shape (M={M}, P={gains.shape[-2]}), got "
                         f"{tuple(reference.shape)}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be a non-negative integer, got {steps!r}")
    states, actions, next_states = transitions
    if not (torch.isfinite(states).all() and torch.isfinite(actions).all()
            and torch.isfinite(next_states).all()):
        raise ValueError("offline transitions contain NaN or infinite values")
    reference = reference.float()
    tau = pair_temperature(reference)
    params = [p for p in twin.parameters() if p.requires_grad]
    optimiser = torch.optim.Adam(params, lr=lr)
    n, B = states.shape[1], starts.shape[1]
    rank_on = bool((weights > 0).any())
    log = TrainingLog([], [])
    rows = torch.arange(M).unsqueeze(1)
    for _ in range(steps):
        idx = torch.randint(0, n, (M, min(batch, n)), generator=generator)
        mse = one_step_loss(twin, states[rows, idx], actions[rows, idx], next_states[rows, idx])
        loss = mse.sum()
        if rank_on:
            sidx = torch.randint(0, B, (M, min(n_starts, B)), generator=generator)
            values = twin_values(twin, gains, starts[rows, sidx], horizon, gamma)
            rank = ranking_loss(values, reference, tau)
            loss = loss + (weights * rank).sum()
            log.ranking.append(float(rank.detach().mean()))
        optimiser.zero_grad()
        loss.backward()
        _clip_per_model(params, max_norm)
        optimiser.step()
        log.one_step.append(float(mse.detach().mean()))
    return log


# --- Decision metrics ---------------------------------------------------------------------------


def _pair(predicted, true) -> tuple[np.ndarray, np.ndarray]:
    predicted = np.asarray(predicted, dtype=float)
    true = np.asarray(true, dtype=float)
    if predicted.shape != true.shape or predicted.ndim != 1:
        raise ValueError(f"need two value vectors of equal length, got {predicted.shape} "
                         f"and {true.shape}")
    if predicted.size < 1:
        raise ValueError("the policy set is empty")
    if not (np.isfinite(predicted).all() and np.isfinite(true).all()):
        raise ValueError("values contain NaN or infinite values")
    return predicted, true


def decision_regret(predicted, true) -> float:
    """``max V - V(argmax V_hat)``, Eq. ``eq-dt2-regret``: the value lost by selecting with the
    twin."""
    predicted, true = _pair(predicted, true)
    return float(true.max() - true[int(np.argmax(predicted))])


def pairwise_accuracy(predicted, true) -> float:
    """Fraction of policy pairs (with distinct true values) that ``predicted`` orders as ``true``
    does, Eq. ``eq-dt2-pairacc``; predicted ties count as half."""
    predicted, true = _pair(predicted, true)
    if predicted.size < 2:
        raise ValueError("pairwise accuracy needs at least two policies")
    i, j = np.triu_indices(predicted.size, k=1)
    sign_true = np.sign(true[i] - true[j])
    keep = sign_true != 0
    agree = np.sign(predicted[i] - predicted[j])[keep] * sign_true[keep]
    return float(np.mean((agree > 0) + 0.5 * (agree == 0)))


def kendall_tau(predicted, true) -> float:
    """Kendall's tau-b between predicted and true values (``scipy.stats.kendalltau``)."""
    predicted, true = _pair(predicted, true)
    return float(stats.kendalltau(predicted, true).statistic)


# --- The analytic counterexample ----------------------------------------------------------------


@dataclass(frozen=True)
class Counterexample:
    """One-step instance of the misranking theorem, Eq. ``eq-dt2-counter``.

    True system ``s' = a^3``, behaviour ``a ~ U[-1, 1]``, twin class ``f_theta(a) = theta a``,
    reward ``r(s') = -(s' - target)^2``, policies ``a = action_a`` and ``a = action_b``.
    """

    target: float = 0.6
    action_a: float = 1.0
    action_b: float = 0.85

    def one_step_mse(self, theta):
        """``E[(a^3 - theta a)^2] = 1/7 - 2 theta / 5 + theta^2 / 3`` for ``a ~ U[-1, 1]``."""
        theta = np.asarray(theta, dtype=float)
        return 1 / 7 - 2 * theta / 5 + theta**2 / 3

    @property
    def theta_mse(self) -> float:
        """The MSE minimiser ``E[a^4] / E[a^2] = (1/5) / (1/3)``."""
        return 0.6

    def true_values(self) -> tuple[float, float]:
        return (-(self.action_a**3 - self.target) ** 2, -(self.action_b**3 - self.target) ** 2)

    def twin_values(self, theta):
        theta = np.asarray(theta, dtype=float)
        return (-(theta * self.action_a - self.target) ** 2,
                -(theta * self.action_b - self.target) ** 2)

    def ranks_correctly(self, theta):
        """Whether the twin ``theta`` orders the two policies as the true system does."""
        true_a, true_b = self.true_values()
        va, vb = self.twin_values(theta)
        return np.sign(va - vb) == np.sign(true_a - true_b)

    def dt2_theta(self, weight: float, grid=None, temperature: float = 0.01) -> float:
        """Minimiser over a grid of ``MSE(theta) + weight softplus(-(V_B - V_A) / tau)``: the DT²
        loss of Eq. ``eq-dt2-loss`` in one dimension, with the true order (B better) as label."""
        weight = float(check_weights([weight])[0])
        grid = np.linspace(0.0, 1.5, 3001) if grid is None else np.asarray(grid, dtype=float)
        va, vb = self.twin_values(grid)
        true_a, true_b = self.true_values()
        sign = np.sign(true_b - true_a)
        loss = self.one_step_mse(grid) + weight * np.logaddexp(0, -sign * (vb - va) / temperature)
        return float(grid[np.argmin(loss)])
