"""Smooth fictitious play, from matrix games to opponent simulation in repeated negotiation.

Chapter ``fictitious-play`` of the book. ``matrix`` holds fictitious play and smooth fictitious
play in matrix games with their regret bound; ``negotiation`` the repeated negotiation games,
the opponent models, best-of-N scoring by simulation, and the agents compared in the chapter;
``reactive`` the sellers that react to the buyer and the buyer's exact regret against them;
``incontext`` tiny transformers meta-trained as in-context opponent models; ``bargaining``
the alternating-offers game (counter-offers) with a belief over seller types and the paper's
judge and self-simulation baselines.
"""

from . import bargaining, incontext
from .matrix import (
    MatrixPlay,
    against_adversary,
    check_game,
    entropy,
    fictitious_play,
    regret_bound,
    rock_paper_scissors,
    shapley_game,
    smooth_best_response,
    stochastic_fictitious_play,
)
from .negotiation import (
    METHODS,
    ExchangeGame,
    LogisticModel,
    Mixture,
    Partner,
    PriceGame,
    RepeatedRun,
    Seller,
    Switching,
    best_of_n,
    bon_choice_probabilities,
    candidate_pool,
    expected_utility,
    fit_logistic,
    play_episode,
    pseudo_data,
    run_repeated,
    sigmoid,
    simulated_utility,
)
from .reactive import (
    Fairness,
    HedgeSeller,
    Reactive,
    TitForTat,
    fixed_strategy_values,
    regret,
    seller_surplus,
    strategy_grid,
    type_values,
)

__all__ = [
    "against_adversary", "bargaining", "best_of_n", "bon_choice_probabilities", "candidate_pool",
    "check_game",
    "entropy", "ExchangeGame", "expected_utility", "Fairness", "fictitious_play", "fit_logistic",
    "fixed_strategy_values", "HedgeSeller", "incontext", "LogisticModel", "MatrixPlay", "METHODS",
    "Mixture",
    "Partner", "play_episode", "PriceGame", "pseudo_data", "Reactive", "regret", "regret_bound",
    "RepeatedRun", "rock_paper_scissors", "run_repeated", "Seller", "seller_surplus",
    "shapley_game", "sigmoid", "simulated_utility", "smooth_best_response",
    "stochastic_fictitious_play", "strategy_grid", "Switching", "TitForTat", "type_values",
]
