"""Alternating offers: the seller counters, the buyer accepts a counter or moves on.

One episode has ``H`` rounds. In round ``h`` the buyer offers ``x_h``; a seller of type ``k``
accepts with probability ``p_kh = sigmoid((x_h - theta_kh) / steepness)``, otherwise it
counters with a price ``c ~ N(mu_kh, spread^2)``, which the buyer accepts when ``c <= a``. A deal
at price ``y`` in round ``h`` is worth ``delta^h (value - y)`` to the buyer; after the last
rejected counter there is no deal (the deadline). A buyer's strategy is a contingent plan
``(x0, rate, a)``: offers ``x_h = min(x0 + rate h, value)`` and the acceptance threshold ``a``.

The expected utility of a plan against one type is exact (Eq. (eq-sfp-ao)):
``sum_h delta^h S_h [p_h (value - x_h) + (1 - p_h) g_h]`` with
``g_h = (value - mu_h) Phi(z_h) + spread phi(z_h)``, ``z_h = (a - mu_h) / spread`` (the expected
gain of the counter rule), and ``S_h = prod_{j<h} (1 - p_j)(1 - Phi(z_j))`` the chance of
reaching round ``h``.

The agents of :func:`run_bargaining` share the candidates (best-of-``N`` over the same proposal
draws) and the seller's coins; they differ only in how a candidate is scored:

* ``"base"``: the first candidate, no scoring;
* ``"prior"``: simulated against the prior mixture over seller types (no learning);
* ``"sfp"``: simulated against the fictitious-play belief, the time average of the per-episode
  posteriors over types (Eq. (eq-sfp-typebelief)), started from ``prior_weight`` pseudo-episodes
  of the prior;
* ``"judge"``: scored without simulating the seller, by a kernel regression of the realised
  utilities of the plans played so far (the paper's evaluation-model baseline);
* ``"judgeprior"``: the judge started from the prior agent's value of each plan: it regresses
  the residual of the realised utility from that value, so it knows what ``"prior"`` knows and
  learns from outcomes only, never from the seller's moves;
* ``"selfsim"``: simulated against a copy of the buyer itself in the seller's role, mirrored
  around the mean past deal price plus ``mirror_shift`` (the paper's self-simulation baseline);
* ``"oracle"``: simulated against the true type of the episode.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr, softmax

from icml26.core import check_count, check_positive

from .negotiation import sigmoid

AO_METHODS = ("base", "prior", "sfp", "judge", "judgeprior", "selfsim", "oracle")
"""The agents of :func:`run_bargaining`."""

_SQRT_2PI = np.sqrt(2 * np.pi)


@dataclass(frozen=True)
class AlternatingGame:
    """The alternating-offers game of one episode (see the module docstring)."""

    rounds: int = 3
    value: float = 1.0
    discount: float = 0.9
    x0_low: float = 0.05
    x0_high: float = 0.8
    rate_high: float = 0.2
    accept_low: float = 0.3

    def __post_init__(self):
        check_count(self.rounds, "rounds", 1)
        check_positive(self.value, "value")
        if not 0 < self.discount <= 1:
            raise ValueError(f"discount must lie in (0, 1], got {self.discount!r}")
        if not 0 <= self.x0_low <= self.x0_high <= self.value:
            raise ValueError("need 0 <= x0_low <= x0_high <= value")
        if self.rate_high < 0 or not 0 <= self.accept_low <= self.value:
            raise ValueError("need rate_high >= 0 and 0 <= accept_low <= value")

    def sample_strategies(self, rng: np.random.Generator, size) -> np.ndarray:
        """Plans ``(x0, rate, a)`` from the proposal distribution: shape ``size + (3,)``."""
        size = (size,) if isinstance(size, numbers.Integral) else tuple(size)
        lows = np.array([self.x0_low, 0.0, self.accept_low])
        highs = np.array([self.x0_high, self.rate_high, self.value])
        return lows + (highs - lows) * rng.random(size + (3,))

    def check_strategies(self, strategies) -> np.ndarray:
        s = np.asarray(strategies, dtype=float)
        if s.ndim < 1 or s.shape[-1] != 3 or not np.all(np.isfinite(s)):
            raise ValueError(f"plans have shape (..., 3) and are finite, got {s.shape}")
        if np.any(s[..., 0] < 0) or np.any(s[..., 1] < 0):
            raise ValueError("offers and rates must be non-negative")
        return s

    def offers(self, strategies) -> np.ndarray:
        """Offers ``x_h`` of plans ``(..., 3)``: shape ``(..., H)``."""
        s = self.check_strategies(strategies)
        return np.minimum(s[..., :1] + s[..., 1:2] * np.arange(self.rounds), self.value)


@dataclass(frozen=True)
class SellerTypes:
    """``J`` seller types of the alternating-offers game.

    Type ``k`` accepts in round ``h`` above
    ``theta_kh = floor + (theta0_k - floor)(1 - h/H)^beta_k`` (as
    :class:`~icml26.fictitious_play.negotiation.Seller`) and otherwise counters around
    ``mu_kh = min(theta_kh + markup_k, value)`` with standard deviation ``spread``.
    """

    theta0: tuple = (0.8, 0.6, 0.45)
    beta: tuple = (0.5, 1.0, 2.0)
    markup: tuple = (0.1, 0.1, 0.1)
    floor: float = 0.3
    steepness: float = 0.03
    spread: float = 0.05

    def __post_init__(self):
        t, b, m = (np.asarray(v, dtype=float) for v in (self.theta0, self.beta, self.markup))
        if t.ndim != 1 or t.size < 1 or b.shape != t.shape or m.shape != t.shape:
            raise ValueError("theta0, beta and markup need one entry per type")
        if np.any(b <= 0) or np.any(t < self.floor) or np.any(m < 0):
            raise ValueError("need beta > 0, theta0 >= floor and markup >= 0 for every type")
        check_positive(self.steepness, "steepness")
        check_positive(self.spread, "spread")

    @property
    def n_types(self) -> int:
        return len(self.theta0)

    def thresholds(self, game: AlternatingGame) -> np.ndarray:
        """``theta_kh``: shape ``(J, H)``."""
        h = np.arange(game.rounds) / game.rounds
        t0, b = np.asarray(self.theta0, float)[:, None], np.asarray(self.beta, float)[:, None]
        return self.floor + (t0 - self.floor) * (1 - h) ** b

    def counters(self, game: AlternatingGame) -> np.ndarray:
        """``mu_kh``: shape ``(J, H)``."""
        return np.minimum(self.thresholds(game) + np.asarray(self.markup, float)[:, None],
                          game.value)


def plan_utility(game: AlternatingGame, offers, accept, p, counter, spread) -> np.ndarray:
    """Exact expected utility of plans against one seller each, Eq. (eq-sfp-ao).

    ``offers`` ``(..., H)`` and ``accept`` (the buyer's threshold ``a``) ``(...)``; the seller
    accepts round ``h`` with probability ``p`` ``(..., H)`` and otherwise counters around
    ``counter`` ``(..., H)`` with standard deviation ``spread`` (all broadcast together).
    """
    p = np.asarray(p, dtype=float)
    mu = np.asarray(counter, dtype=float)
    z = (np.asarray(accept, dtype=float)[..., None] - mu) / spread
    cdf = ndtr(z)
    gain = (game.value - mu) * cdf + spread * np.exp(-0.5 * z * z) / _SQRT_2PI
    delta = game.discount ** np.arange(game.rounds)
    step = p * (game.value - offers) + (1 - p) * gain
    go_on = (1 - p) * (1 - cdf)
    survive = np.cumprod(np.concatenate([np.ones(go_on.shape[:-1] + (1,)), go_on[..., :-1]],
                                        axis=-1), axis=-1)
    return (delta * survive * step).sum(axis=-1)


def type_utilities(game: AlternatingGame, types: SellerTypes, strategies) -> np.ndarray:
    """Exact expected utility of each plan against each type: ``(..., J)``, Eq. (eq-sfp-ao)."""
    s = game.check_strategies(strategies)
    x = game.offers(s)[..., None, :]  # (..., 1, H)
    p = sigmoid((x - types.thresholds(game)) / types.steepness)  # (..., J, H)
    return plan_utility(game, x, s[..., None, 2], p, types.counters(game), types.spread)


def selfsim_utilities(game: AlternatingGame, strategies, anchor, steepness: float,
                      spread: float) -> np.ndarray:
    """Expected utility of each plan against a copy of the buyer in the seller's role.

    The copy mirrors the plan around ``anchor`` (``(...)``, broadcast against the plans'
    leading shape): it accepts an offer above ``2 anchor - a`` (the mirror of the buyer's
    acceptance rule) and counters at ``2 anchor - x_h`` (the mirror of the buyer's offer).
    """
    s = game.check_strategies(strategies)
    x = game.offers(s)
    m = np.asarray(anchor, dtype=float)[..., None]
    p = sigmoid((x - (2 * m - s[..., 2:3])) / steepness)
    mu = np.clip(2 * m - x, 0.0, game.value)
    return plan_utility(game, x, s[..., 2], p, mu, spread)


def play(game: AlternatingGame, types: SellerTypes, strategies, type_index, coins, noise,
         seller_types: SellerTypes | None = None):
    """Play one episode per row against the true types, vectorised over rows.

    ``strategies`` ``(R, 3)``, ``type_index`` ``(R,)``, ``coins`` (uniforms deciding the seller's
    acceptance) and ``noise`` (standard normals of its counters), both ``(R, H)``. Returns
    ``(utility (R,), price (R,) or NaN, loglik (R, J))``: ``loglik`` is the log-likelihood of
    the seller's observed moves under each type (the buyer's own choices carry no information).
    The seller plays type ``type_index`` of ``seller_types`` (``types`` by default); the
    likelihood is always under ``types``, the buyer's hypotheses.
    """
    s = game.check_strategies(strategies)
    r = s.shape[0]
    k = np.asarray(type_index)
    if k.shape != (r,) or np.asarray(coins).shape != (r, game.rounds) or \
            np.asarray(noise).shape != (r, game.rounds):
        raise ValueError("need one type per row and (R, H) coins and noise")
    x = game.offers(s)
    theta, mu = types.thresholds(game), types.counters(game)
    p_all = sigmoid((x[:, None, :] - theta) / types.steepness)  # (R, J, H)
    true = types if seller_types is None else seller_types
    p = sigmoid((x - true.thresholds(game)[k]) / true.steepness)
    seller_yes = coins < p
    counter = true.counters(game)[k] + true.spread * noise
    buyer_yes = ~seller_yes & (counter <= s[:, 2:3])
    ended = seller_yes | buyer_yes
    stop = np.where(ended.any(axis=1), ended.argmax(axis=1), game.rounds)
    deal = stop < game.rounds
    last = np.minimum(stop, game.rounds - 1)
    rows = np.arange(r)
    price = np.where(seller_yes[rows, last], x[rows, last], counter[rows, last])
    utility = np.where(deal, game.discount ** last * (game.value - price), 0.0)
    # log-likelihood of the seller's moves in the rounds reached
    reached = np.arange(game.rounds) <= np.where(deal, stop, game.rounds - 1)[:, None]
    z = (counter[:, None, :] - mu) / types.spread
    log_counter = -0.5 * z * z - np.log(types.spread * _SQRT_2PI)
    eps = 1e-300
    lik = np.where(seller_yes[:, None, :], np.log(p_all + eps),
                   np.log1p(-np.minimum(p_all, 1 - 1e-16)) + log_counter)
    loglik = np.where(reached[:, None, :], lik, 0.0).sum(axis=-1)
    return utility, np.where(deal, price, np.nan), loglik


def posterior(loglik) -> np.ndarray:
    """Per-episode posterior over types under a uniform prior: ``softmax(loglik)``."""
    return softmax(np.asarray(loglik, dtype=float), axis=-1)


@dataclass
class BargainRun:
    """One agent over ``episodes`` episodes, ``R`` replicates at once."""

    method: str
    expected: np.ndarray
    """Exact expected utility of each episode's plan against that episode's seller, ``(R, T)``."""
    utilities: np.ndarray
    """Realised utilities, ``(R, T)``."""
    beliefs: np.ndarray | None = None
    """sFP only: the belief over types before each episode, ``(R, T, J)``."""

    def mean(self) -> np.ndarray:
        """Mean expected utility per replicate over the run: ``(R,)``."""
        return self.expected.mean(axis=1)


def _seed_list(seeds) -> list:
    """Replicate seeds as a list: an int, or a list of ints or of int sequences."""
    if isinstance(seeds, numbers.Integral):
        return [int(seeds)]
    out = list(seeds)
    if not out:
        raise ValueError("need at least one replicate seed")
    return out


def seller_sequence(types: SellerTypes, seeds, episodes: int, redraw: bool,
                    prior=None) -> np.ndarray:
    """The seller's type in each episode of each replicate, ``(R, T)``.

    A fixed seller keeps one type drawn from ``prior`` (uniform by default) for the whole run;
    with ``redraw`` it draws a fresh type from ``prior`` every episode.
    """
    w = np.full(types.n_types, 1 / types.n_types) if prior is None else np.asarray(prior, float)
    out = []
    for seed in _seed_list(seeds):
        rng = np.random.default_rng([*np.atleast_1d(seed).tolist(), 11])
        draws = rng.choice(types.n_types, size=episodes if redraw else 1, p=w)
        out.append(np.resize(draws, episodes))
    return np.array(out)


def run_bargaining(game: AlternatingGame, types: SellerTypes, method: str, *, seeds,
                   episodes: int, n_candidates: int = 16, redraw: bool = False, prior=None,
                   prior_weight: float = 1.0, bandwidth: float = 0.2, anchor: float = 0.5,
                   seller_prior=None, mirror_shift: float = 0.0,
                   seller_types: SellerTypes | None = None) -> BargainRun:
    """Play ``episodes`` alternating-offers negotiations with one agent, one replicate per seed.

    Every agent with the same seeds meets the same sellers, the same candidates (the first
    ``n_candidates`` of a pool of 64 per episode) and the same coins. ``prior`` is the buyer's
    prior over types (uniform by default); ``prior_weight`` its weight in pseudo-episodes for
    ``"sfp"``; ``bandwidth`` the judge's kernel width (on plans scaled to the unit cube);
    ``anchor`` the self-simulation's mirror point before the first deal and ``mirror_shift`` the
    offset it adds to the mirror point. ``seller_prior`` is the distribution the seller's types
    are drawn from (uniform by default). ``seller_types`` are the types the seller really plays
    (``types``, the buyer's hypotheses, by default): with other types the buyer's model is
    misspecified, and the oracle best-responds to the seller's true type.
    """
    if method not in AO_METHODS:
        raise ValueError(f"method must be one of {AO_METHODS}, got {method!r}")
    episodes = check_count(episodes, "episodes", 1)
    n = 1 if method == "base" else check_count(n_candidates, "n_candidates (N)", 1)
    if n > 64:
        raise ValueError("n_candidates must be at most 64 (the pool size)")
    if isinstance(prior_weight, bool) or not prior_weight > 0:
        raise ValueError(f"prior_weight must be positive, got {prior_weight!r}")
    check_positive(bandwidth, "bandwidth")
    seeds = _seed_list(seeds)
    r, j, h = len(seeds), types.n_types, game.rounds
    prior = np.full(j, 1 / j) if prior is None else np.asarray(prior, dtype=float)
    if prior.shape != (j,) or np.any(prior < 0) or not np.isclose(prior.sum(), 1):
        raise ValueError("prior must be a probability vector over the types")
    true = types if seller_types is None else seller_types
    sellers = seller_sequence(true, seeds, episodes, redraw, seller_prior)
    pools, coins, noise = [], [], []
    for seed in seeds:
        rng = np.random.default_rng([*np.atleast_1d(seed).tolist(), 12])
        pools.append(game.sample_strategies(rng, (episodes, 64)))
        coins.append(rng.random((episodes, h)))
        noise.append(rng.standard_normal((episodes, h)))
    pool, coins, noise = np.array(pools)[:, :, :n], np.array(coins), np.array(noise)
    scale = np.array([game.x0_high - game.x0_low, max(game.rate_high, 1e-12),
                      game.value - game.accept_low])
    rows = np.arange(r)
    expected, utilities = np.zeros((r, episodes)), np.zeros((r, episodes))
    counts = prior_weight * np.broadcast_to(prior, (r, j)).copy()
    beliefs, played, played_prior = [], [], []
    deal_sum, deal_n = np.zeros(r), np.zeros(r)
    for t in range(episodes):
        cand = pool[:, t]  # (R, N, 3)
        eu = type_utilities(game, types, cand)  # (R, N, J)
        eu_true = eu if seller_types is None else type_utilities(game, true, cand)
        belief = counts / counts.sum(axis=1, keepdims=True)
        beliefs.append(belief)
        if method == "base" or n == 1:
            scores = np.zeros((r, n))
        elif method == "prior":
            scores = eu @ prior
        elif method == "sfp":
            scores = np.einsum("rnj,rj->rn", eu, belief)
        elif method == "oracle":
            scores = eu_true[rows, :, sellers[:, t]]
        elif method == "selfsim":
            m = np.where(deal_n > 0, deal_sum / np.maximum(deal_n, 1), anchor) + mirror_shift
            scores = selfsim_utilities(game, cand, m[:, None], types.steepness, types.spread)
        else:  # judge(prior): kernel regression of realised utility on the plans played so far
            base_value = eu @ prior if method == "judgeprior" else np.zeros((r, n))
            if t == 0:
                scores = base_value
            else:
                past = np.stack([p for p, _ in played], axis=1)  # (R, t, 3)
                u = np.stack([v for _, v in played], axis=1)  # (R, t)
                if method == "judgeprior":  # learn the residual from the prior's value
                    u = u - np.stack(played_prior, axis=1)
                d2 = (((cand[:, :, None, :] - past[:, None, :, :]) / scale) ** 2).sum(-1)
                k = np.exp(-0.5 * d2 / bandwidth ** 2)  # (R, N, t)
                scores = base_value + (k * u[:, None, :]).sum(-1) / (k.sum(-1) + 1e-3)
        pick = scores.argmax(axis=1)
        plan = cand[rows, pick]
        utility, price, loglik = play(game, types, plan, sellers[:, t], coins[:, t], noise[:, t],
                                      seller_types)
        expected[:, t] = eu_true[rows, pick, sellers[:, t]]
        utilities[:, t] = utility
        counts = counts + posterior(loglik)
        played.append((plan, utility))
        played_prior.append(eu[rows, pick] @ prior)
        deal = ~np.isnan(price)
        deal_sum += np.where(deal, price, 0.0)
        deal_n += deal
    return BargainRun(method, expected, utilities,
                      np.stack(beliefs, axis=1) if method == "sfp" else None)


def tune(game: AlternatingGame, types: SellerTypes, method: str, name: str, grid, *, seeds,
         episodes: int, **kwargs):
    """Pick the value of the parameter ``name`` from ``grid`` with the best mean expected utility
    on the (validation) ``seeds``; returns ``(best value, mean utility per grid value)``."""
    grid = list(grid)
    if not grid:
        raise ValueError("the tuning grid is empty")
    means = np.array([run_bargaining(game, types, method, seeds=seeds, episodes=episodes,
                                     **{name: v}, **kwargs).mean().mean() for v in grid])
    return grid[int(np.argmax(means))], means


def simulate_utility(game: AlternatingGame, types: SellerTypes, strategy, type_index: int,
                     samples: int, rng: np.random.Generator) -> np.ndarray:
    """Realised utilities of ``samples`` independent episodes of one plan against one type
    (the Monte Carlo check of Eq. (eq-sfp-ao))."""
    samples = check_count(samples, "samples", 1)
    s = np.broadcast_to(np.asarray(strategy, dtype=float), (samples, 3))
    k = np.full(samples, int(type_index))
    u, _, _ = play(game, types, s, k, rng.random((samples, game.rounds)),
                   rng.standard_normal((samples, game.rounds)))
    return u


__all__ = ["AO_METHODS", "AlternatingGame", "BargainRun", "SellerTypes", "play",
           "plan_utility", "posterior", "run_bargaining", "seller_sequence", "selfsim_utilities",
           "simulate_utility", "tune", "type_utilities"]
