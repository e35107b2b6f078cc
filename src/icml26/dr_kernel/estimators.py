"""Turn-level advantages, the exact bias of self-inclusion, and mismatch rejection.

* :func:`group_advantages`: REINFORCE without baseline, turn-level GRPO (group mean including the
  sample, Eq. ``eq-drk-grpo``, optionally divided by the group standard deviation) and turn-level
  leave-one-out, TRLOO (Eq. ``eq-drk-trloo``). Groups are the valid rollouts of one prompt at one
  turn; ``valid`` marks them.
* :class:`RefinementProcess`: a multi-turn refinement toy with known success and termination
  probabilities, its analytic policy gradient (Eq. ``eq-drk-true-grad``) and the closed-form
  shrink factor of turn-level GRPO (Eq. ``eq-drk-shrink``).
* :func:`mismatch_keep`: mismatch rejection with a geometric-mean importance-ratio band and a
  per-token veto (Eq. ``eq-drk-mrs``).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

ESTIMATORS = ("none", "grpo", "grpo_std", "trloo")
"""Advantage estimators: no baseline, GRPO (mean), GRPO (mean and std), TRLOO."""

REWARD_MEAN = 0.4
"""Mean of the reward a successful turn earns in :class:`RefinementProcess`."""


def _check_method(method: str) -> str:
    if method not in ESTIMATORS:
        raise ValueError(f"unknown estimator {method!r}; choose one of {', '.join(ESTIMATORS)}")
    return method


def _check_probabilities(values, name: str, *, open_interval: bool = False) -> tuple[float, ...]:
    if isinstance(values, numbers.Real):
        values = (values,)
    try:
        out = tuple(float(v) for v in values)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of probabilities") from None
    for v in out:
        if not math.isfinite(v) or not 0.0 <= v <= 1.0:
            raise ValueError(f"{name} must lie in [0, 1], got {v}")
        if open_interval and v in (0.0, 1.0):
            raise ValueError(f"{name} must lie strictly between 0 and 1, got {v}")
    return out


def _check_group_size(group_size) -> int:
    if isinstance(group_size, bool) or not isinstance(group_size, numbers.Integral):
        raise TypeError(f"group size must be an integer, got {type(group_size).__name__}")
    if group_size < 2:
        raise ValueError(f"group size must be at least 2 (a baseline needs other rollouts), "
                         f"got {group_size}")
    return int(group_size)


def group_advantages(returns, valid, method: str, *, eps: float = 1e-6) -> np.ndarray:
    """Advantages of every group member along the last axis; invalid members get 0.

    ``returns`` and ``valid`` have shape ``(..., K)``: the last axis is the group (one prompt at one
    turn). With ``N`` valid members and ``G_i`` their returns-to-go:

    * ``"none"``: ``A_i = G_i`` (REINFORCE, no baseline);
    * ``"grpo"``: ``A_i = G_i - mean(G)`` over the ``N`` valid members, Eq. ``eq-drk-grpo``
      (0 when ``N = 1``);
    * ``"grpo_std"``: the same divided by the group's standard deviation plus ``eps``;
    * ``"trloo"``: ``A_i = G_i - mean_{j != i} G_j``, Eq. ``eq-drk-trloo``, and ``A_i = G_i`` when
      ``N = 1`` (as in the released code).
    """
    _check_method(method)
    returns = np.asarray(returns, dtype=float)
    valid = np.asarray(valid)
    if valid.dtype != bool:
        raise TypeError("valid must be a boolean array")
    if returns.shape != valid.shape:
        raise ValueError(f"returns {returns.shape} and valid {valid.shape} must have one shape")
    if returns.ndim == 0 or returns.shape[-1] < 2:
        raise ValueError("the last axis is the group and needs at least 2 members")
    G = np.where(valid, returns, 0.0)
    n = valid.sum(-1, keepdims=True)
    total = G.sum(-1, keepdims=True)
    safe_n = np.maximum(n, 1)
    if method == "none":
        adv = G
    elif method in ("grpo", "grpo_std"):
        mean = total / safe_n
        adv = G - mean
        if method == "grpo_std":
            var = (np.where(valid, G - mean, 0.0) ** 2).sum(-1, keepdims=True) / safe_n
            adv = adv / (np.sqrt(var) + eps)
    else:
        loo = (total - G) / np.maximum(n - 1, 1)
        adv = np.where(n >= 2, G - loo, G)
    return np.where(valid, adv, 0.0)


def returns_to_go(rewards, gamma: float = 1.0) -> np.ndarray:
    """``G_t = sum_{k >= t} gamma^(k - t) r_k`` along the last axis, Eq. ``eq-drk-return``."""
    rewards = np.asarray(rewards, dtype=float)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
    out = np.zeros_like(rewards)
    running = np.zeros(rewards.shape[:-1])
    for t in range(rewards.shape[-1] - 1, -1, -1):
        running = rewards[..., t] + gamma * running
        out[..., t] = running
    return out


@dataclass(frozen=True)
class Rollouts:
    """A batch of groups: arrays of shape ``(groups, K, T)``."""

    valid: np.ndarray  # the rollout is still alive at turn t
    success: np.ndarray  # the turn's attempt succeeded (only meaningful where valid)
    rewards: np.ndarray  # r_{i,t}; 0 where not valid
    scores: np.ndarray  # d log pi(y_t) / d theta_t = C_t - p_t where valid, else 0

    @property
    def returns(self) -> np.ndarray:
        return returns_to_go(self.rewards)


@dataclass(frozen=True)
class RefinementProcess:
    """A ``T``-turn refinement toy with known success and termination probabilities.

    At turn ``t`` every still-alive rollout makes an attempt that succeeds with probability
    ``p_t = sigmoid(theta_t)``; a success earns a reward with mean :data:`REWARD_MEAN` (0 w.p. 0.4,
    0.5 w.p. 0.4, uniform on [0.5, 1.5] w.p. 0.2), a failure earns 0. After turn ``t < T`` the
    rollout stops with probability ``termination[t]``, independently of everything else.
    """

    success: tuple[float, ...] = (0.3, 0.5, 0.7)
    termination: tuple[float, ...] = (0.5, 0.5)
    group_size: int = 4

    def __post_init__(self):
        success = _check_probabilities(self.success, "success probabilities", open_interval=True)
        termination = _check_probabilities(self.termination, "termination probabilities")
        if len(termination) != len(success) - 1:
            raise ValueError(f"need one termination probability per turn but the last: "
                             f"{len(success)} turns, {len(termination)} probabilities")
        object.__setattr__(self, "success", success)
        object.__setattr__(self, "termination", termination)
        object.__setattr__(self, "group_size", _check_group_size(self.group_size))

    @property
    def turns(self) -> int:
        return len(self.success)

    def survival(self) -> np.ndarray:
        """``a_t = P(a rollout is alive at turn t) = prod_{s < t} (1 - q_s)``."""
        return np.concatenate([[1.0], np.cumprod(1.0 - np.asarray(self.termination))])

    def objective(self) -> float:
        """``J = E[sum_t r_t] = mu * sum_t a_t p_t`` for one rollout."""
        return float(REWARD_MEAN * np.sum(self.survival() * np.asarray(self.success)))

    def true_gradient(self) -> np.ndarray:
        """``dJ / d theta_t = a_t * mu * p_t (1 - p_t)``, Eq. ``eq-drk-true-grad``."""
        p = np.asarray(self.success)
        return self.survival() * REWARD_MEAN * p * (1 - p)

    def grpo_prediction(self) -> np.ndarray:
        """Expected GRPO / true-gradient ratio ``1 - P(N_t >= 1) / E[N_t]``, Eq. ``eq-drk-shrink``.

        ``N_t ~ Binomial(K, a_t)`` counts the valid rollouts of a group at turn ``t``.
        """
        a = self.survival()
        K = self.group_size
        return 1.0 - (1.0 - (1.0 - a) ** K) / (K * a)

    def sample(self, groups: int, rng: np.random.Generator) -> Rollouts:
        """Simulate ``groups`` independent groups of ``K`` rollouts."""
        if isinstance(groups, bool) or not isinstance(groups, numbers.Integral) or groups < 1:
            raise ValueError(f"groups must be a positive integer, got {groups!r}")
        return _simulate(np.asarray(self.success), self.termination, (groups, self.group_size),
                         rng)


def _simulate(p: np.ndarray, termination, shape: tuple[int, ...],
              rng: np.random.Generator) -> Rollouts:
    """Rollouts of the refinement toy with success probabilities ``p`` (shape ``(..., T)``,
    broadcast against ``shape + (T,)``), arrays of shape ``shape + (T,)``."""
    T = p.shape[-1]
    full = (*shape, T)
    stop = rng.random((*shape, T - 1)) < np.asarray(termination)
    alive = np.ones(full, dtype=bool)
    for t in range(1, T):
        alive[..., t] = alive[..., t - 1] & ~stop[..., t - 1]
    success = rng.random(full) < p
    u = rng.random(full)
    size = np.where(u < 0.4, 0.0, np.where(u < 0.8, 0.5, rng.uniform(0.5, 1.5, u.shape)))
    rewards = np.where(alive & success, size, 0.0)
    scores = np.where(alive, success - p, 0.0)
    return Rollouts(alive, success & alive, rewards, scores)


def gradient_estimates(rollouts: Rollouts, method: str) -> np.ndarray:
    """Per-group gradient estimates ``(1/K) sum_i A_{i,t} (C_{i,t} - p_t)``, shape ``(groups, T)``.

    The advantage of turn ``t`` is computed over the valid rollouts at that turn, Eq.
    ``eq-drk-estimator``; dividing by ``K`` (not ``N_t``) makes the target the per-rollout
    gradient of Eq. ``eq-drk-true-grad``.
    """
    returns = np.moveaxis(rollouts.returns, 1, -1)  # (groups, T, K)
    valid = np.moveaxis(rollouts.valid, 1, -1)
    adv = group_advantages(returns, valid, method)
    scores = np.moveaxis(rollouts.scores, 1, -1)
    return (adv * scores).sum(-1) / returns.shape[-1]


@dataclass(frozen=True)
class BiasEstimate:
    """Monte Carlo mean of an estimator divided by the true gradient, with its standard error."""

    method: str
    ratio: np.ndarray
    standard_error: np.ndarray
    groups: int


def gradient_ratio(process: RefinementProcess, method: str, groups: int,
                   rng: np.random.Generator, *, rollouts: Rollouts | None = None) -> BiasEstimate:
    """Estimate ``E[g_hat_t] / (dJ/d theta_t)`` per turn over ``groups`` Monte Carlo groups."""
    _check_method(method)
    rollouts = process.sample(groups, rng) if rollouts is None else rollouts
    est = gradient_estimates(rollouts, method)
    truth = process.true_gradient()
    n = est.shape[0]
    return BiasEstimate(method, est.mean(0) / truth, est.std(0, ddof=1) / math.sqrt(n) / truth, n)


def train_refinement(process: RefinementProcess, method: str, *, steps: int, groups_per_step: int,
                     lr: float, rng: np.random.Generator, init_logit: float = -2.0) -> np.ndarray:
    """Gradient ascent on the turn logits with one estimator; returns ``J(theta)`` at every step.

    The success probabilities of ``process`` are replaced by ``sigmoid(theta)``, starting from
    ``init_logit`` at every turn. The curve is the exact objective, so the only noise is the
    gradient estimator's. ``method="grpo_rescaled"`` is GRPO with each turn's estimate divided by
    its shrink factor (Eq. ``eq-drk-shrink``), whose expected update is TRLOO's.
    """
    rescale = method == "grpo_rescaled"
    method = "grpo" if rescale else _check_method(method)
    theta = np.full(process.turns, float(init_logit))
    curve = np.empty(steps + 1)
    for step in range(steps + 1):
        p = 1.0 / (1.0 + np.exp(-theta))
        current = RefinementProcess(tuple(np.clip(p, 1e-9, 1 - 1e-9)), process.termination,
                                    process.group_size)
        curve[step] = current.objective()
        if step == steps:
            break
        step_dir = gradient_estimates(current.sample(groups_per_step, rng), method).mean(0)
        if rescale:
            step_dir = step_dir / current.grpo_prediction()
        theta = theta + lr * step_dir
    return curve


SHARED_METHODS = ("trloo", "grpo", "grpo_rescaled")
"""Estimators of the shared-parameter toy: TRLOO, GRPO (mean) and GRPO with each turn's term
divided by its shrink factor (Eq. ``eq-drk-shrink``)."""


@dataclass(frozen=True)
class SharedParameterToy:
    """The refinement toy with one parameter ``theta`` shared by every turn.

    Turn ``t`` succeeds with probability ``p_t = sigmoid(w_t theta + o_t)`` (``weights`` ``w``,
    ``offsets`` ``o``), so the per-turn gradients pull ``theta`` in different directions when the
    weights differ in sign. Rewards and stopping are those of :class:`RefinementProcess`. The
    objective is ``J = mu sum_t a_t p_t`` and its gradient Eq. ``eq-drk-shared``.
    """

    weights: tuple[float, ...] = (1.0, 0.0, -1.0)
    offsets: tuple[float, ...] = (2.0, 0.0, 2.0)
    termination: tuple[float, ...] = (0.5, 0.5)
    group_size: int = 4

    def __post_init__(self):
        try:
            weights = tuple(float(w) for w in self.weights)
            offsets = tuple(float(c) for c in self.offsets)
        except TypeError:
            raise TypeError("weights and offsets must be sequences of numbers") from None
        if len(weights) != len(offsets) or len(weights) < 2:
            raise ValueError("need one weight and one offset per turn, at least two turns")
        if not all(math.isfinite(v) for v in weights + offsets):
            raise ValueError("weights and offsets must be finite")
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "offsets", offsets)
        # validates the termination probabilities and the group size
        process = RefinementProcess((0.5,) * len(weights), self.termination, self.group_size)
        object.__setattr__(self, "termination", process.termination)
        object.__setattr__(self, "group_size", process.group_size)
        object.__setattr__(self, "_survival", process.survival())
        object.__setattr__(self, "_shrink", process.grpo_prediction())

    @property
    def turns(self) -> int:
        return len(self.weights)

    def success(self, theta) -> np.ndarray:
        """``p_t = sigmoid(w_t theta + o_t)``, shape ``theta.shape + (T,)``."""
        theta = np.asarray(theta, dtype=float)[..., None]
        return 1.0 / (1.0 + np.exp(-(theta * np.asarray(self.weights) + np.asarray(self.offsets))))

    def survival(self) -> np.ndarray:
        """``a_t``, the probability that a rollout is alive at turn ``t``."""
        return self._survival.copy()

    def shrink(self) -> np.ndarray:
        """The per-turn GRPO shrink factors of Eq. ``eq-drk-shrink`` (independent of theta)."""
        return self._shrink.copy()

    def objective(self, theta) -> np.ndarray:
        """``J(theta) = mu sum_t a_t p_t(theta)``."""
        return REWARD_MEAN * (self.survival() * self.success(theta)).sum(-1)

    def turn_weights(self, method: str) -> np.ndarray:
        """How much of turn ``t``'s true gradient the method's expected update carries."""
        if method not in SHARED_METHODS:
            raise ValueError(f"unknown method {method!r}; choose one of "
                             f"{', '.join(SHARED_METHODS)}")
        return self.shrink() if method == "grpo" else np.ones(self.turns)

    def expected_update(self, theta, method: str = "trloo") -> np.ndarray:
        """Eq. ``eq-drk-shared-fixed``: ``mu sum_t lambda_t w_t a_t p_t (1 - p_t)``, with
        ``lambda_t`` the shrink factor for GRPO and 1 for TRLOO and rescaled GRPO (for which it
        is the true gradient ``dJ/dtheta``, Eq. ``eq-drk-shared``)."""
        p = self.success(theta)
        per_turn = REWARD_MEAN * self.survival() * np.asarray(self.weights) * p * (1 - p)
        return (self.turn_weights(method) * per_turn).sum(-1)

    def fixed_point(self, method: str = "trloo", bracket: tuple[float, float] = (-20.0, 20.0),
                    ) -> float:
        """The root of the expected update (Eq. ``eq-drk-shared-fixed``) inside ``bracket``."""
        from scipy import optimize

        low, high = bracket
        f_low, f_high = (float(self.expected_update(x, method)) for x in (low, high))
        if not f_low > 0 > f_high:
            raise ValueError(f"the expected update of {method!r} does not change sign from + to "
                             f"- on {bracket}: no interior fixed point")
        return float(optimize.brentq(lambda x: float(self.expected_update(x, method)), low, high,
                                     xtol=1e-12))

    def gradient_estimates(self, theta, method: str, groups: int,
                           rng: np.random.Generator) -> np.ndarray:
        """One stochastic update per entry of ``theta``: the mean over ``groups`` groups of
        ``sum_t w_t g_hat_t / lambda_t`` (Eq. ``eq-drk-estimator`` per turn and the chain rule;
        ``lambda_t`` is 1 except for ``grpo_rescaled``)."""
        self.turn_weights(method)
        theta = np.asarray(theta, dtype=float)
        if groups < 1:
            raise ValueError(f"groups must be at least 1, got {groups}")
        p = self.success(theta)[..., None, None, :]  # (..., 1, 1, T)
        roll = _simulate(p, self.termination, (*theta.shape, groups, self.group_size), rng)
        returns = np.moveaxis(roll.returns, -2, -1)  # (..., groups, T, K)
        valid = np.moveaxis(roll.valid, -2, -1)
        base = "trloo" if method == "trloo" else "grpo"
        adv = group_advantages(returns, valid, base)
        per_turn = (adv * np.moveaxis(roll.scores, -2, -1)).sum(-1) / self.group_size
        scale = np.asarray(self.weights)
        if method == "grpo_rescaled":
            scale = scale / self.shrink()
        return (per_turn * scale).sum(-1).mean(-1)


@dataclass(frozen=True)
class SharedRun:
    """Parameter paths of several replicates (``(steps + 1, replicates)``) and their averages."""

    path: np.ndarray
    average: np.ndarray  # Polyak average of theta over the last ``tail`` of the steps


def train_shared(toy: SharedParameterToy, method: str, *, replicates: int, steps: int,
                 groups_per_step: int, lr: float, rng: np.random.Generator,
                 theta0: float = 0.0, tail: float = 0.5) -> SharedRun:
    """Stochastic gradient ascent on the shared parameter, ``theta += lr * update``, for
    ``replicates`` independent runs at once; the average of the last ``tail`` of the path
    estimates the method's fixed point (Eq. ``eq-drk-shared-fixed``)."""
    if not isinstance(toy, SharedParameterToy):
        raise TypeError("toy must be a SharedParameterToy")
    toy.turn_weights(method)
    for value, name in ((replicates, "replicates"), (steps, "steps"),
                        (groups_per_step, "groups_per_step")):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not lr > 0 or not 0 < tail <= 1:
        raise ValueError(f"need lr > 0 and tail in (0, 1], got {lr} and {tail}")
    theta = np.full(replicates, float(theta0))
    path = np.empty((steps + 1, replicates))
    path[0] = theta
    for step in range(steps):
        theta = theta + lr * toy.gradient_estimates(theta, method, groups_per_step, rng)
        path[step + 1] = theta
    start = steps + 1 - max(1, int(round(tail * steps)))
    return SharedRun(path, path[start:].mean(0))


def mismatch_keep(logp_train, logp_rollout, mask=None, *,
                  band: tuple[float, float] = (0.999, 1.001), veto: float = 1e-4,
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Mismatch rejection: keep a sequence iff its geometric-mean ratio lies in ``band``, Eq.
    ``eq-drk-mrs``, and no token ratio falls below ``veto``.

    Arrays have shape ``(sequences, tokens)``; ``mask`` marks the real tokens. Returns the boolean
    keep mask and the geometric-mean ratios ``exp(mean_k log(pi_train / pi_rollout))``.
    """
    lt = np.asarray(logp_train, dtype=float)
    lr = np.asarray(logp_rollout, dtype=float)
    if lt.shape != lr.shape or lt.ndim != 2:
        raise ValueError(f"log-probabilities must be two (sequences, tokens) arrays of one shape, "
                         f"got {lt.shape} and {lr.shape}")
    mask = np.ones(lt.shape, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    if mask.shape != lt.shape:
        raise ValueError("mask must have the shape of the log-probabilities")
    low, high = band
    if not 0 < low <= 1 <= high:
        raise ValueError(f"band must satisfy 0 < low <= 1 <= high, got {band}")
    if not 0 <= veto < 1:
        raise ValueError(f"veto must lie in [0, 1), got {veto}")
    log_ratio = np.where(mask, lt - lr, 0.0)
    counts = mask.sum(1)
    if np.any(counts == 0):
        raise ValueError("every sequence needs at least one real token")
    geo = np.exp(log_ratio.sum(1) / counts)
    vetoed = np.any(mask & (log_ratio < math.log(veto) if veto > 0 else False), axis=1)
    keep = (geo >= low) & (geo <= high) & ~vetoed
    return keep, geo
