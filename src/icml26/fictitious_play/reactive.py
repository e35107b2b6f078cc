"""Sellers that react to the buyer, and the buyer's exact regret against them.

A reactive seller behaves in each episode as a mixture of a fixed, finite set of seller types
(:class:`~icml26.fictitious_play.negotiation.Seller`, Eq. (eq-sfp-seller)). The mixture weights
are a *state* that the seller updates after every episode from the buyer's offers, and only from
them: given the buyer's strategies the seller's behaviour is deterministic, so every expected
utility below is exact (Eq. (eq-sfp-eu) per type, mixed by the weights). The three sellers model
personas of the prompt library the paper's authors released:

* :class:`TitForTat`: it cooperates (a soft type) after a fair opening offer and retaliates (a
  hard type) after a lowball one, mirroring the buyer's last move;
* :class:`Fairness`: a grudge that rises by one step after each lowball opening and falls by one
  after each fair one; every step raises its whole reservation curve;
* :class:`HedgeSeller`: a seller that learns, by Hedge over its reservation types, which type
  would have earned it most against the buyer's offers so far.

Every state is vectorised over a batch of buyers (first axis), so the value of *every* fixed
strategy of a grid against a reactive seller is computed in one pass
(:func:`fixed_strategy_values`), and with it the buyer's regret (Eq. (eq-sfp-nregret)).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from icml26.core import check_count, check_positive

from .negotiation import Mixture, PriceGame, Seller, expected_utility


def seller_surplus(game: PriceGame, seller: Seller, offers) -> np.ndarray:
    """The seller's exact expected surplus ``price - floor`` against offers ``(n, H, 1)``."""
    x = game.check_offers(offers)[..., 0]
    p = seller.accept_probability(game, offers)
    survive = np.cumprod(np.concatenate([np.ones((p.shape[0], 1)), 1 - p[:, :-1]], axis=1), axis=1)
    return (survive * p * (x - seller.floor)).sum(axis=1)


class Reactive:
    """Base class: a seller whose mixture over ``types`` evolves with the buyer's offers."""

    types: tuple = ()

    def initial(self, n: int) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def weights(self, state) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def update(self, state, game: PriceGame, offers) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def current(self, state) -> Mixture:
        """The seller of the next episode, for a state of one buyer."""
        return Mixture(self.types, self.weights(state)[0])


def _opening(game, offers) -> np.ndarray:
    return game.check_offers(offers)[:, 0, 0]


@dataclass(frozen=True)
class TitForTat(Reactive):
    """Soft after a fair opening offer (at least ``fair``), hard after a lowball one.

    State: the index of the type played next (0 hard, 1 soft); it starts soft (cooperative).
    """

    hard: Seller = field(default_factory=lambda: Seller(theta0=0.75, beta=0.7))
    soft: Seller = field(default_factory=lambda: Seller(theta0=0.55, beta=2.0))
    fair: float = 0.45

    @property
    def types(self):
        return (self.hard, self.soft)

    def initial(self, n):
        return np.ones(check_count(n, "n", 1), dtype=int)

    def weights(self, state):
        return np.eye(2)[np.asarray(state, dtype=int)]

    def update(self, state, game, offers):
        return (_opening(game, offers) >= self.fair).astype(int)


@dataclass(frozen=True)
class Fairness(Reactive):
    """A grudge ``g`` in ``0..levels``: up one step after a lowball opening (below ``fair``),
    down one after a fair one. At grudge ``g`` the seller's reservation curve, opening and floor,
    is raised by ``g * step``: it rejects unfair offers even at its own cost."""

    base: Seller = field(default_factory=lambda: Seller(theta0=0.6, beta=1.0))
    fair: float = 0.45
    step: float = 0.06
    levels: int = 4

    def __post_init__(self):
        check_count(self.levels, "levels", 1)
        check_positive(self.step, "step")

    @property
    def types(self):
        b = self.base
        return tuple(Seller(theta0=b.theta0 + g * self.step, beta=b.beta,
                            floor=b.floor + g * self.step, steepness=b.steepness)
                     for g in range(self.levels + 1))

    def initial(self, n):
        return np.zeros(check_count(n, "n", 1), dtype=int)

    def weights(self, state):
        return np.eye(self.levels + 1)[np.asarray(state, dtype=int)]

    def update(self, state, game, offers):
        lowball = _opening(game, offers) < self.fair
        return np.clip(np.asarray(state) + np.where(lowball, 1, -1), 0, self.levels)


@dataclass(frozen=True)
class HedgeSeller(Reactive):
    """A seller that learns: Hedge with rate ``eta`` over reservation types ``theta0s``.

    After each episode every type is credited with the surplus it would have earned against the
    buyer's offers (:func:`seller_surplus`); the next episode's type is drawn with probabilities
    ``softmax(eta * cumulative surplus)``. State: the cumulative surpluses, one per type.
    """

    theta0s: tuple = (0.45, 0.55, 0.65, 0.75, 0.85)
    beta: float = 1.0
    eta: float = 8.0

    def __post_init__(self):
        check_positive(self.eta, "eta")
        if len(self.theta0s) < 2:
            raise ValueError("a Hedge seller needs at least two types")

    @property
    def types(self):
        return tuple(Seller(theta0=t, beta=self.beta) for t in self.theta0s)

    def initial(self, n):
        return np.zeros((check_count(n, "n", 1), len(self.theta0s)))

    def weights(self, state):
        z = self.eta * np.asarray(state, dtype=float)
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)

    def update(self, state, game, offers):
        gains = np.stack([seller_surplus(game, s, offers) for s in self.types], axis=1)
        return np.asarray(state, dtype=float) + gains


def type_values(game, seller: Reactive, strategies) -> np.ndarray:
    """Exact expected utility of each strategy against each type: ``(n, J)``, Eq. (eq-sfp-eu)."""
    return np.stack([expected_utility(game, s, strategies) for s in seller.types], axis=1)


def fixed_strategy_values(game, seller: Reactive, strategies, episodes: int) -> np.ndarray:
    """Exact total expected utility of each strategy played in every one of ``episodes``
    episodes against ``seller``, which reacts to it: ``(n,)``."""
    episodes = check_count(episodes, "episodes", 1)
    s = np.asarray(strategies, dtype=float)
    values, offers = type_values(game, seller, s), game.offers(s)
    state, total = seller.initial(s.shape[0]), np.zeros(s.shape[0])
    for _ in range(episodes):
        total += (seller.weights(state) * values).sum(axis=1)
        state = seller.update(state, game, offers)
    return total


def strategy_grid(game: PriceGame, points: int = 41) -> np.ndarray:
    """A ``points x points`` grid of the proposal's support of strategies ``(x0, rate)``."""
    points = check_count(points, "points", 2)
    x0 = np.linspace(game.x0_low, game.x0_high, points)
    rate = np.linspace(0.0, game.rate_high, points)
    return np.stack(np.meshgrid(x0, rate, indexing="ij"), axis=-1).reshape(-1, 2)


def regret(game, seller: Reactive, run, grid=None, kind: str = "external",
           values=None) -> float:
    """The buyer's average regret per episode against the best fixed strategy of ``grid``,
    exact, Eq. (eq-sfp-nregret).

    ``kind="external"``: the fixed strategy meets the *realised* sequence of sellers (the
    mixtures the buyer actually faced), the regret of eq-sfp-regret. ``kind="policy"``: the
    fixed strategy is played from the first episode and the seller reacts to it. The buyer's
    side is the exact expected utility of what it played, ``run.expected``. ``values``, the
    :func:`type_values` of ``grid``, may be passed to save recomputing them for many runs.
    """
    if kind not in ("external", "policy"):
        raise ValueError(f"kind must be 'external' or 'policy', got {kind!r}")
    if run.mixtures is None:
        raise ValueError("the run was not played against a reactive seller")
    grid = strategy_grid(game) if grid is None else np.asarray(grid, dtype=float)
    episodes = run.expected.size
    if kind == "external":
        if values is None:
            values = type_values(game, seller, grid)
        elif np.shape(values) != (grid.shape[0], len(seller.types)):
            raise ValueError("values must be the type_values of the grid")
        best = float(np.max(values @ run.mixtures.sum(axis=0)))
    else:
        best = float(np.max(fixed_strategy_values(game, seller, grid, episodes)))
    return (best - float(run.expected.sum())) / episodes


__all__ = ["Fairness", "HedgeSeller", "Reactive", "TitForTat", "fixed_strategy_values",
           "regret", "seller_surplus", "strategy_grid", "type_values"]
