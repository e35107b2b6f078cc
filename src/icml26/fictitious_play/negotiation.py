"""Repeated negotiation with opponent simulation: smooth fictitious play as inference-time search.

An agent meets the same (hidden) opponent in many episodes. Each episode is a short negotiation:
the agent proposes in rounds ``h = 0, ..., H-1`` and the opponent accepts or rejects each
proposal. The agent's "language model" is a stochastic proposal distribution over negotiation
strategies. Smooth fictitious play (sFP) turns it into an adaptive agent without changing it:

1. **belief**: an opponent model fitted to *all* past episodes (the time-averaged opponent,
   Eq. (eq-sfp-model));
2. **best response**: best-of-``N`` candidates drawn from the proposal distribution, each scored
   by simulating the negotiation against the model, exactly (Eq. (eq-sfp-eu)) or by Monte Carlo
   rollouts.

Two game forms share the code: a buyer bargaining over a price (:class:`PriceGame`) and a
two-issue exchange (:class:`ExchangeGame`). The methods of :func:`run_repeated` are the base
policy (no adaptation), best-of-``N`` against a fixed prior model, against a model of the last
episode only, against the time-averaged model (sFP), and against the true opponent (oracle).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import numpy as np

from icml26.core import check_count, check_positive

METHODS = ("base", "prior", "last", "sfp", "window", "discount", "oracle")
"""The agents of :func:`run_repeated`."""

SCORINGS = ("exact", "mc")


def sigmoid(z):
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(z, dtype=float)))


# --- games ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PriceGame:
    """A buyer (the agent) offers a price in each of ``rounds`` rounds; a deal at ``x`` is worth
    ``value - x`` to the buyer.

    A strategy is ``(x0, rate)``: offer ``x_h = min(x0 + rate h, value)``. The proposal
    distribution (the agent's "language model") draws ``x0 ~ U[x0_low, x0_high]`` and
    ``rate ~ U[0, rate_high]``. Offers must lie in ``[0, value]``.
    """

    rounds: int = 5
    value: float = 1.0
    x0_low: float = 0.05
    x0_high: float = 0.8
    rate_high: float = 0.2

    def __post_init__(self):
        check_count(self.rounds, "rounds", 1)
        check_positive(self.value, "value")
        if not 0 <= self.x0_low <= self.x0_high <= self.value:
            raise ValueError("need 0 <= x0_low <= x0_high <= value")
        if self.rate_high < 0:
            raise ValueError("rate_high must be non-negative")

    n_issues = 1
    n_params = 2

    def sample_strategies(self, rng: np.random.Generator, size) -> np.ndarray:
        """Draw strategies from the proposal distribution: shape ``size + (2,)``."""
        size = (size,) if isinstance(size, numbers.Integral) else tuple(size)
        u = rng.random(size + (2,))
        lows = np.array([self.x0_low, 0.0])
        highs = np.array([self.x0_high, self.rate_high])
        return lows + (highs - lows) * u

    def offers(self, strategies) -> np.ndarray:
        """Offers ``(n, H, 1)`` of strategies ``(n, 2)``."""
        s = np.asarray(strategies, dtype=float)
        if s.ndim != 2 or s.shape[1] != 2:
            raise ValueError(f"price strategies have shape (n, 2), got {s.shape}")
        h = np.arange(self.rounds)
        x = np.minimum(s[:, :1] + s[:, 1:] * h, self.value)
        return self.check_offers(x[..., None])

    def check_offers(self, offers) -> np.ndarray:
        x = np.asarray(offers, dtype=float)
        if x.ndim != 3 or x.shape[1:] != (self.rounds, 1):
            raise ValueError(f"offers must have shape (n, {self.rounds}, 1), got {x.shape}")
        if x.size and not (x.min() >= 0 and x.max() <= self.value):  # False for NaN too
            raise ValueError(f"offers must lie in the feasible range [0, {self.value}]")
        return x

    def utility(self, offers) -> np.ndarray:
        """The agent's payoff ``value - x_h`` if round ``h``'s offer is accepted: ``(n, H)``."""
        return self.value - self.check_offers(offers)[..., 0]

    def features(self, offers) -> np.ndarray:
        """Opponent-model features ``(1, x, h/H, x h/H)`` of each proposal: ``(n, H, 4)``."""
        x = self.check_offers(offers)[..., 0]
        t = np.broadcast_to(np.arange(self.rounds) / self.rounds, x.shape)
        return np.stack([np.ones_like(x), x, t, x * t], axis=-1)

    def grid_offers(self, points: int = 21) -> np.ndarray:
        """Constant offers on a grid of ``[0, value]``: ``(points, H, 1)`` (prior pseudo-data)."""
        x = np.linspace(0.0, self.value, points)
        return np.repeat(x[:, None, None], self.rounds, axis=1)

    def threshold_model(self, threshold: float, steepness: float = 0.03) -> LogisticModel:
        """A fixed model "the seller accepts offers above ``threshold`` in every round"."""
        check_positive(steepness, "steepness")
        return LogisticModel(np.array([-threshold / steepness, 1 / steepness, 0.0, 0.0]))


@dataclass(frozen=True)
class ExchangeGame:
    """Two issues to divide; a proposal gives the agent the shares ``x = (x1, x2)`` in ``[0, 1]^2``.

    The agent values a deal at ``weights . x``. A strategy is ``(s1, s2, rate)``: propose
    ``x_h = max(s - rate h, 0)`` on both issues. The proposal distribution draws ``s`` uniform
    on ``[0, 1]^2`` and ``rate ~ U[0, rate_high]``.
    """

    rounds: int = 4
    weights: tuple[float, float] = (0.7, 0.3)
    rate_high: float = 0.15

    n_issues = 2
    n_params = 3

    def __post_init__(self):
        check_count(self.rounds, "rounds", 1)
        w = np.asarray(self.weights, dtype=float)
        if w.shape != (2,) or np.any(w < 0):
            raise ValueError("weights must be two non-negative numbers")

    def sample_strategies(self, rng: np.random.Generator, size) -> np.ndarray:
        size = (size,) if isinstance(size, numbers.Integral) else tuple(size)
        u = rng.random(size + (3,))
        return u * np.array([1.0, 1.0, self.rate_high])

    def offers(self, strategies) -> np.ndarray:
        s = np.asarray(strategies, dtype=float)
        if s.ndim != 2 or s.shape[1] != 3:
            raise ValueError(f"exchange strategies have shape (n, 3), got {s.shape}")
        h = np.arange(self.rounds)
        x = np.clip(s[:, None, :2] - s[:, None, 2:] * h[None, :, None], 0.0, 1.0)
        return self.check_offers(x)

    def check_offers(self, offers) -> np.ndarray:
        x = np.asarray(offers, dtype=float)
        if x.ndim != 3 or x.shape[1:] != (self.rounds, 2):
            raise ValueError(f"offers must have shape (n, {self.rounds}, 2), got {x.shape}")
        if not np.all(np.isfinite(x)) or np.any(x < 0) or np.any(x > 1):
            raise ValueError("shares must lie in the feasible range [0, 1]")
        return x

    def utility(self, offers) -> np.ndarray:
        return self.check_offers(offers) @ np.asarray(self.weights, dtype=float)

    def features(self, offers) -> np.ndarray:
        """Opponent-model features ``(1, x1, x2, h/H)``: ``(n, H, 4)``."""
        x = self.check_offers(offers)
        t = np.broadcast_to(np.arange(self.rounds) / self.rounds, x.shape[:2])
        return np.concatenate([np.ones(x.shape[:2] + (1,)), x, t[..., None]], axis=-1)

    def grid_offers(self, points: int = 6) -> np.ndarray:
        """Constant proposals on a ``points x points`` grid of shares: ``(points^2, H, 2)``."""
        g = np.linspace(0.0, 1.0, points)
        x = np.stack(np.meshgrid(g, g, indexing="ij"), axis=-1).reshape(-1, 2)
        return np.repeat(x[:, None, :], self.rounds, axis=1)

    def symmetric_model(self, reservation: float, steepness: float = 0.05) -> LogisticModel:
        """A fixed model "the partner weighs both issues equally and wants ``reservation``"."""
        check_positive(steepness, "steepness")
        return LogisticModel(np.array([(1.0 - reservation) / steepness, -0.5 / steepness,
                                       -0.5 / steepness, 0.0]))


# --- opponents and opponent models -----------------------------------------------------------


@dataclass(frozen=True)
class Seller:
    """A seller with a hidden concession type ``(theta0, beta)``, Eq. (eq-sfp-seller).

    Its reservation price falls from ``theta0`` towards ``floor`` as
    ``theta_h = floor + (theta0 - floor)(1 - h/H)^beta``; it accepts ``x`` with probability
    ``sigmoid((x - theta_h) / steepness)``.
    """

    theta0: float = 0.75
    beta: float = 0.7
    floor: float = 0.3
    steepness: float = 0.03

    def __post_init__(self):
        check_positive(self.beta, "beta")
        check_positive(self.steepness, "steepness")
        if not (np.isfinite(self.theta0) and np.isfinite(self.floor)) or self.floor > self.theta0:
            raise ValueError(f"need a finite floor <= theta0, got floor={self.floor!r}, "
                             f"theta0={self.theta0!r}")

    def thresholds(self, rounds: int) -> np.ndarray:
        h = np.arange(rounds) / rounds
        return self.floor + (self.theta0 - self.floor) * (1 - h) ** self.beta

    def accept_probability(self, game: PriceGame, offers, episode: int = 0) -> np.ndarray:
        x = game.check_offers(offers)[..., 0]
        return sigmoid((x - self.thresholds(game.rounds)) / self.steepness)


@dataclass(frozen=True)
class Partner:
    """An exchange partner with hidden issue weights; it accepts with probability
    ``sigmoid((w . (1 - x) - r_h) / steepness)``, its demand ``r_h`` falling by ``concession``
    per round."""

    weights: tuple[float, float] = (0.2, 0.8)
    reservation: float = 0.5
    concession: float = 0.05
    steepness: float = 0.05

    def __post_init__(self):
        w = np.asarray(self.weights, dtype=float)
        if w.shape != (2,) or np.any(w < 0) or not np.all(np.isfinite(w)):
            raise ValueError("partner weights must be two non-negative numbers")
        check_positive(self.steepness, "steepness")

    def accept_probability(self, game: ExchangeGame, offers, episode: int = 0) -> np.ndarray:
        x = game.check_offers(offers)
        theirs = (1 - x) @ np.asarray(self.weights, dtype=float)
        demand = self.reservation - self.concession * np.arange(game.rounds)
        return sigmoid((theirs - demand) / self.steepness)


@dataclass(frozen=True)
class Switching:
    """An opponent that switches type every ``period`` episodes, cycling through ``types``."""

    types: tuple
    period: int = 3

    def __post_init__(self):
        check_count(self.period, "period", 1)
        if len(self.types) < 1:
            raise ValueError("a switching opponent needs at least one type")

    def current(self, episode: int):
        return self.types[(episode // self.period) % len(self.types)]

    def accept_probability(self, game, offers, episode: int = 0) -> np.ndarray:
        return self.current(episode).accept_probability(game, offers, episode)


@dataclass(frozen=True)
class Mixture:
    """The seller of one episode: type ``types[j]`` with probability ``weights[j]``."""

    types: tuple
    weights: np.ndarray

    def __post_init__(self):
        w = np.asarray(self.weights, dtype=float)
        if w.shape != (len(self.types),) or np.any(w < -1e-12) or not np.isclose(w.sum(), 1.0):
            raise ValueError("mixture weights must be a probability vector, one per type")

    def pick(self, uniform: float):
        """The type drawn by the uniform number ``uniform`` (inverse CDF)."""
        cdf = np.cumsum(np.asarray(self.weights, dtype=float))
        return self.types[min(int(np.searchsorted(cdf, uniform, side="right")),
                              len(self.types) - 1)]


@dataclass(frozen=True)
class LogisticModel:
    """Opponent model: ``P(accept) = sigmoid(features . coef)``, Eq. (eq-sfp-model)."""

    coef: np.ndarray

    def accept_probability(self, game, offers, episode: int = 0) -> np.ndarray:
        f = game.features(offers)
        coef = np.asarray(self.coef, dtype=float)
        if coef.shape != (f.shape[-1],):
            raise ValueError(f"model has {coef.shape} coefficients, "
                             f"the game {f.shape[-1]} features")
        return sigmoid(f @ coef)


def fit_logistic(features, accepts, weights=None, ridge: float = 1e-3, coef0=None,
                 iterations: int = 50) -> np.ndarray:
    """Weighted, ridge-penalised logistic regression by damped Newton steps, Eq. (eq-sfp-model).

    Maximises ``sum_i c_i [y_i log p_i + (1 - y_i) log(1 - p_i)] - ridge/2 |w|^2`` with
    ``p_i = sigmoid(f_i . w)``, weights ``c_i >= 0`` and (possibly soft) labels ``y_i`` in
    ``[0, 1]``. With no data the answer is ``w = 0``: acceptance 1/2 everywhere.
    """
    X = np.asarray(features, dtype=float)
    y = np.asarray(accepts, dtype=float)
    if X.ndim != 2 or y.shape != (X.shape[0],):
        raise ValueError(f"features (n, d) and accepts (n,) needed, got {X.shape}, {y.shape}")
    if np.any(y < 0) or np.any(y > 1):
        raise ValueError("accepts must lie in [0, 1]")
    c = np.ones(X.shape[0]) if weights is None else np.asarray(weights, dtype=float)
    if c.shape != y.shape or np.any(c < 0) or not np.all(np.isfinite(c)):
        raise ValueError("weights must be non-negative, one per observation")
    ridge = check_positive(ridge, "ridge")
    w = np.zeros(X.shape[1]) if coef0 is None else np.array(coef0, dtype=float)
    if X.shape[0] == 0:
        return np.zeros(X.shape[1])
    eye = ridge * np.eye(X.shape[1])

    def objective(v):
        z = X @ v
        return float(np.sum(c * (y * z - np.logaddexp(0.0, z))) - 0.5 * ridge * v @ v)

    current = objective(w)
    for _ in range(iterations):
        p = sigmoid(X @ w)
        grad = X.T @ (c * (y - p)) - ridge * w
        hess = (X * (c * p * (1 - p))[:, None]).T @ X + eye
        step = np.linalg.solve(hess, grad)
        size = 1.0
        while size > 1e-6:  # backtracking: Newton steps on a logistic likelihood can overshoot
            trial = objective(w + size * step)
            if trial >= current - 1e-12:
                break
            size *= 0.5
        w, gain, current = w + size * step, trial - current, trial
        if abs(gain) < 1e-10 * (1 + abs(current)):
            break
    return w


def pseudo_data(game, model, weight: float):
    """A prior belief as ``weight`` pseudo-observations, Eq. (eq-sfp-model).

    The model's acceptance probabilities on a grid of proposals become soft labels whose
    weights sum to ``weight``: the counterpart of the initial weights of fictitious play.
    Returns ``(features, labels, weights)``.
    """
    if isinstance(weight, bool) or not np.isfinite(weight) or weight < 0:
        raise ValueError(f"prior weight must be a non-negative number, got {weight!r}")
    offers = game.grid_offers()
    f = game.features(offers).reshape(-1, game.features(offers).shape[-1])
    y = model.accept_probability(game, offers).reshape(-1)
    return f, y, np.full(y.size, weight / y.size)


# --- scoring and best-of-N --------------------------------------------------------------------


def expected_utility(game, model, strategies, episode: int = 0) -> np.ndarray:
    """Exact expected payoff of each strategy against ``model``, Eq. (eq-sfp-eu).

    ``sum_h p_h prod_{j<h} (1 - p_j) u_h``; cost ``O(N H)`` model evaluations. Against a
    :class:`Mixture` of types, the weighted sum of the types' expected utilities.
    """
    if isinstance(model, Mixture):
        return sum(w * expected_utility(game, m, strategies, episode)
                   for m, w in zip(model.types, model.weights, strict=True))
    offers = game.offers(strategies)
    p = model.accept_probability(game, offers, episode)
    survive = np.cumprod(np.concatenate([np.ones((p.shape[0], 1)), 1 - p[:, :-1]], axis=1),
                         axis=1)
    return (survive * p * game.utility(offers)).sum(axis=1)


def simulated_utility(game, model, strategies, rollouts: int, rng: np.random.Generator,
                      episode: int = 0) -> np.ndarray:
    """Monte Carlo estimate of :func:`expected_utility` from ``rollouts`` simulated negotiations
    per strategy against ``model``; cost ``O(N M H)`` model evaluations."""
    rollouts = check_count(rollouts, "rollouts", 1)
    if isinstance(model, Mixture):
        return sum(w * simulated_utility(game, m, strategies, rollouts, rng, episode)
                   for m, w in zip(model.types, model.weights, strict=True))
    offers = game.offers(strategies)
    p = model.accept_probability(game, offers, episode)
    u = game.utility(offers)
    accepted = rng.random((p.shape[0], rollouts, p.shape[1])) < p[:, None, :]
    first = np.where(accepted.any(axis=2), accepted.argmax(axis=2), -1)
    payoff = np.where(first >= 0, np.take_along_axis(u, np.maximum(first, 0), axis=1), 0.0)
    return payoff.mean(axis=1)


def best_of_n(scores) -> int:
    """Index of the best-scoring candidate (the first one on ties)."""
    s = np.asarray(scores, dtype=float)
    if s.ndim != 1 or s.size < 1:
        raise ValueError("best_of_n needs a non-empty vector of scores")
    return int(np.argmax(s))


# --- the repeated game ------------------------------------------------------------------------


@dataclass
class RepeatedRun:
    """One agent over ``episodes`` episodes against one opponent."""

    method: str
    n_candidates: int
    utilities: np.ndarray
    deals: np.ndarray
    strategies: np.ndarray
    model_queries: int
    coefs: list = field(default_factory=list)
    expected: np.ndarray | None = None
    """Exact expected utility of each episode's strategy against that episode's seller."""
    mixtures: np.ndarray | None = None
    """Against a reactive seller: its weights over its types in each episode, ``(T, J)``."""

    def last(self, episodes: int) -> float:
        """Mean true utility over the last ``episodes`` episodes."""
        return float(self.utilities[-episodes:].mean())


def play_episode(game, opponent, strategy, uniforms, episode: int = 0):
    """Play one negotiation against the true ``opponent``.

    ``uniforms`` (``H`` numbers in ``[0, 1)``) decide acceptance: round ``h`` is accepted when
    ``uniforms[h] < p_h``. Returns ``(utility, deal_round or -1, features seen, accepts seen)``.
    """
    offers = game.offers(np.asarray(strategy, dtype=float)[None])
    p = opponent.accept_probability(game, offers, episode)[0]
    uniforms = np.asarray(uniforms, dtype=float)
    if uniforms.shape != (game.rounds,):
        raise ValueError(f"need {game.rounds} acceptance uniforms, got shape {uniforms.shape}")
    accepted = uniforms < p
    deal = int(np.argmax(accepted)) if accepted.any() else -1
    seen = game.rounds if deal < 0 else deal + 1
    utility = 0.0 if deal < 0 else float(game.utility(offers)[0, deal])
    feats = game.features(offers)[0, :seen]
    return utility, deal, feats, accepted[:seen].astype(float)


def candidate_pool(game, seed, episodes: int, pool_size: int = 64) -> np.ndarray:
    """The proposal draws of one replicate: ``(episodes, pool_size, n_params)``.

    Every agent with the same ``seed`` sees the same candidates; best-of-``N`` uses the first
    ``N`` of each episode, so the candidate sets are nested in ``N``.
    """
    rng = np.random.default_rng([*np.atleast_1d(seed).tolist(), 0])
    return game.sample_strategies(rng, (episodes, pool_size))


def run_repeated(game, opponent, method: str, *, episodes: int, n_candidates: int = 16,
                 seed=0, prior=None, prior_weight: float = 5.0, scoring: str = "exact",
                 rollouts: int = 8, ridge: float = 1e-3, pool_size: int = 64, window: int = 3,
                 discount: float = 0.7) -> RepeatedRun:
    """Play ``episodes`` negotiations with one agent (Algorithm in the chapter).

    ``method``: ``"base"`` plays the first proposal (no adaptation); ``"prior"`` best-of-``N``
    scored against the fixed model ``prior``; ``"last"`` against a model fitted on the previous
    episode only; ``"sfp"`` against a model fitted on every past episode (the time-averaged
    belief); ``"oracle"`` against the true opponent. ``"last"`` and ``"sfp"`` start from
    ``prior`` as ``prior_weight`` pseudo-observations (:func:`pseudo_data`), or from the uniform
    belief when ``prior`` is None. ``"window"`` fits the last ``window`` episodes and
    ``"discount"`` weighs the episode ``m`` steps back by ``discount**(m - 1)``
    (Eq. (eq-sfp-memory)). The same ``seed`` gives every method the same candidates and the same
    acceptance coins (common random numbers).

    ``opponent`` is a fixed seller, a :class:`Switching` one, or a reactive seller (an object with
    ``types``, ``initial``, ``weights`` and ``update``, see ``reactive``) whose type in each
    episode is drawn from its current weights by a coin of its own.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
    episodes = check_count(episodes, "episodes", 1)
    n = check_count(n_candidates, "n_candidates (N)", 1)
    pool_size = check_count(pool_size, "pool_size", 1)
    if n > pool_size:
        raise ValueError(f"n_candidates = {n} exceeds pool_size = {pool_size}")
    if method == "prior" and prior is None:
        raise ValueError("method 'prior' needs a prior opponent model")
    rollouts = check_count(rollouts, "rollouts", 1)
    if method == "base":
        n = 1
    window = check_count(window, "window", 1)
    if isinstance(discount, bool) or not 0 < discount <= 1:
        raise ValueError(f"discount must lie in (0, 1], got {discount!r}")
    reactive = all(hasattr(opponent, a) for a in ("types", "initial", "weights", "update"))
    state = opponent.initial(1) if reactive else None
    type_coins = np.random.default_rng([*np.atleast_1d(seed).tolist(), 3]).random(episodes)
    expected, mixtures = np.zeros(episodes), []
    base_seed = np.atleast_1d(seed).tolist()
    pool = candidate_pool(game, seed, episodes, pool_size)
    coins = np.random.default_rng([*base_seed, 1]).random((episodes, game.rounds))
    mc_rng = np.random.default_rng([*base_seed, 2])
    utilities, deals, chosen = np.zeros(episodes), np.full(episodes, -1), []
    history_f, history_y, coefs = [], [], []
    coef = np.zeros(game.features(game.offers(pool[0, :1])).shape[-1])
    if prior is not None:
        prior_f, prior_y, prior_c = pseudo_data(game, prior, prior_weight)
    else:
        prior_f, prior_y, prior_c = np.zeros((0, coef.size)), np.zeros(0), np.zeros(0)
    queries = 0
    for t in range(episodes):
        candidates = pool[t, :n]
        if reactive:
            mixtures.append(opponent.weights(state)[0])
            seller_now = Mixture(tuple(opponent.types), mixtures[-1])
        else:
            seller_now = opponent
        if n == 1:
            pick = 0
        else:
            if method == "prior":
                model = prior
            elif method == "oracle":
                model = seller_now
            else:
                keep = {"last": 1, "window": window}.get(method, t)
                ages = np.arange(t, 0, -1)[-keep:] if t else np.zeros(0, dtype=int)
                episode_w = discount ** (ages - 1.0) if method == "discount" else np.ones(ages.size)
                used, labels = history_f[t - ages.size:], history_y[t - ages.size:]
                f = np.concatenate([prior_f, *used])
                y = np.concatenate([prior_y, *labels])
                c = np.concatenate([prior_c, *[np.full(lab.size, w) for lab, w
                                               in zip(labels, episode_w, strict=True)]])
                coef = fit_logistic(f, y, c, ridge, coef0=coef if method != "last" else None)
                coefs.append(coef.copy())
                model = LogisticModel(coef)
            if scoring == "exact":
                scores = expected_utility(game, model, candidates, t)
                queries += n * game.rounds
            else:
                scores = simulated_utility(game, model, candidates, rollouts, mc_rng, t)
                queries += n * rollouts * game.rounds
            pick = best_of_n(scores)
        strategy = candidates[pick]
        played = seller_now.pick(type_coins[t]) if reactive else opponent
        utility, deal, f, y = play_episode(game, played, strategy, coins[t], t)
        utilities[t], deals[t] = utility, deal
        expected[t] = expected_utility(game, seller_now, strategy[None], t)[0]
        if reactive:
            state = opponent.update(state, game, game.offers(strategy[None]))
        chosen.append(strategy)
        history_f.append(f)
        history_y.append(y)
    return RepeatedRun(method, n, utilities, deals, np.array(chosen), queries, coefs, expected,
                       np.array(mixtures) if reactive else None)


def bon_choice_probabilities(base, scores, n_candidates: int) -> np.ndarray:
    """Exact distribution of the best-of-``N`` choice over a finite action set.

    Actions are drawn i.i.d. from ``base``; the best-scoring draw is kept (scores must be
    distinct). ``P(a) = F(a)^N - F(a^-)^N`` with ``F`` the CDF of ``base`` in score order.
    """
    p = np.asarray(base, dtype=float)
    s = np.asarray(scores, dtype=float)
    n = check_count(n_candidates, "n_candidates (N)", 1)
    if p.ndim != 1 or s.shape != p.shape:
        raise ValueError("base and scores must be vectors of one length")
    if np.any(p < 0) or not np.isclose(p.sum(), 1.0):
        raise ValueError("base must be a probability vector")
    if np.unique(s).size != s.size:
        raise ValueError("scores must be distinct")
    order = np.argsort(s)
    cdf = np.cumsum(p[order])
    below = np.concatenate([[0.0], cdf[:-1]])
    out = np.empty_like(p)
    out[order] = np.clip(cdf, 0, 1) ** n - np.clip(below, 0, 1) ** n
    return out
