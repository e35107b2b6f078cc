"""Fitted Q-evaluation on random Fourier features: the proxy values DT² ranks by.

Finite-horizon FQE (Eq. ``eq-dt2-fqe``): ``Q_0 = 0`` and, for ``h = 1..T``, ``Q_h`` is the ridge
regression of ``r + gamma Q_{h-1}(s', pi(s'))`` on the features of ``(s, a)``. Then
``V_FQE(pi) = mean over start states of Q_T(s_0, pi(s_0))``, which estimates the same ``T``-step
discounted value as the rollouts (Eq. ``eq-dt2-value``). Because the features of ``(s, a)`` do
not change between iterations, the regression is one projection ``(Phi^T Phi + alpha I)^{-1}
Phi^T``, and each iteration is an ``F x F`` product in weight space. Cost
``O(n F^2 + F^3)`` once, plus ``O(P (n F^2 + T F^2))`` for ``P`` policies.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from icml26.decision_twins.env import (
    MAX_SPEED,
    MAX_TORQUE,
    OfflineData,
    check_gains,
    check_gamma,
    check_horizon,
    check_offline,
    policy_torque,
)


class FourierFeatures:
    """Random Fourier features of ``(cos theta, sin theta, theta_dot / 8, u / 2)`` plus a constant:
    ``sqrt(2/F) cos(W x + b)`` with ``W ~ N(0, 1 / lengthscale^2)``, ``b ~ U[0, 2 pi]``."""

    def __init__(self, n_features: int, lengthscale: float, rng: np.random.Generator):
        if isinstance(n_features, bool) or not isinstance(n_features, int) or n_features < 1:
            raise ValueError(f"n_features must be a positive integer, got {n_features!r}")
        if not lengthscale > 0:
            raise ValueError(f"lengthscale must be positive, got {lengthscale}")
        self.weights = torch.from_numpy(rng.standard_normal((4, n_features)) / lengthscale)
        self.offsets = torch.from_numpy(rng.uniform(0, 2 * math.pi, n_features))
        self.n_features = n_features

    def __call__(self, state: torch.Tensor, torque: torch.Tensor) -> torch.Tensor:
        theta, theta_dot = state[..., 0], state[..., 1]
        x = torch.stack([torch.cos(theta), torch.sin(theta), theta_dot / MAX_SPEED,
                         torque / MAX_TORQUE], dim=-1).to(torch.float64)
        phi = math.sqrt(2.0 / self.n_features) * torch.cos(x @ self.weights + self.offsets)
        return torch.cat([phi, torch.ones(*phi.shape[:-1], 1, dtype=phi.dtype)], dim=-1)


def fitted_q_evaluation(data: OfflineData, gains: torch.Tensor, horizon: int, gamma: float, *,
                        n_features: int = 200, lengthscale: float = 0.5, ridge: float = 1e-3,
                        rng: np.random.Generator | None = None,
                        starts: torch.Tensor | None = None) -> torch.Tensor:
    """FQE values of ``P`` policies from offline data, Eq. ``eq-dt2-fqe``. Returns ``(P,)``.

    ``starts`` defaults to the episodes' start states in ``data``; ``ridge`` is relative to the
    mean diagonal of the Gram matrix.
    """
    check_offline(data)
    gains = check_gains(gains)
    horizon, gamma = check_horizon(horizon), check_gamma(gamma)
    if not ridge > 0:
        raise ValueError(f"ridge must be positive, got {ridge}")
    rng = np.random.default_rng(0) if rng is None else rng
    starts = data.starts if starts is None else starts
    features = FourierFeatures(n_features, lengthscale, rng)
    phi = features(data.states, data.actions)                       # (n, F+1)
    gram = phi.T @ phi
    gram = gram + ridge * gram.diagonal().mean() * torch.eye(gram.shape[0], dtype=gram.dtype)
    projector = torch.linalg.solve(gram, phi.T)                      # (F+1, n)
    offset = projector @ data.rewards.to(torch.float64)              # (F+1,)
    values = torch.empty(gains.shape[0], dtype=torch.float64)
    for p in range(gains.shape[0]):  # one policy at a time keeps memory at n x F
        k = gains[p:p + 1]
        next_phi = features(data.next_states, policy_torque(k, data.next_states[None])[0])
        start_phi = features(starts, policy_torque(k, starts[None])[0])
        transition = projector @ next_phi                            # (F+1, F+1)
        weights = torch.zeros(phi.shape[1], dtype=torch.float64)
        for _ in range(horizon):  # Eq. eq-dt2-fqe in weight space: w_h = c + gamma A w_{h-1}
            weights = offset + gamma * (transition @ weights)
        values[p] = (start_phi @ weights).mean()
    return values
