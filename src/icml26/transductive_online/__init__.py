"""Universal multiclass transductive online learning, computed exactly on finite classes.

Chapter ``transductive-online`` of the book. ``classes`` builds projected classes, ``minimax``
holds the exact game values, ``learners`` the learners, the minimax adversary and the game loop,
``trees`` the level-constrained dimensions and the (reconstructed) LCLL tree search, ``drawing``
the tree figures.
"""

from .classes import (
    FiniteClass,
    all_functions,
    check_realizable,
    disjoint_blocks,
    dyadic_points,
    finite_class,
    project,
    sparse_multiclass,
    thresholds,
)
from .drawing import draw_game_tree, draw_tree
from .learners import (
    GameResult,
    HalvingLearner,
    MemorizingLearner,
    MinimaxLearner,
    RandomizedMinimaxLearner,
    play,
    play_adversary,
    worst_case_mistakes,
)
from .minimax import (
    MinimaxSolver,
    deterministic_combine,
    minimax_mistakes,
    randomized_combine,
    randomized_minimax_value,
    reduce_class,
    water_filling,
    worst_prior_value,
)
from .trees import (
    LCLLNode,
    LCNode,
    find_lcll_tree,
    is_binary,
    lc_paths,
    lcll_depth,
    level_constrained_branching,
    level_constrained_dimension,
    level_constrained_tree,
    littlestone_dimension,
    verify_lcll_tree,
)

__all__ = [
    "FiniteClass", "GameResult", "HalvingLearner", "LCLLNode", "LCNode", "MemorizingLearner",
    "MinimaxLearner", "MinimaxSolver", "RandomizedMinimaxLearner", "all_functions",
    "check_realizable", "deterministic_combine", "disjoint_blocks", "draw_game_tree", "draw_tree",
    "dyadic_points",
    "find_lcll_tree", "finite_class", "is_binary", "lc_paths", "lcll_depth",
    "level_constrained_branching", "level_constrained_dimension", "level_constrained_tree",
    "littlestone_dimension", "minimax_mistakes", "play", "play_adversary", "project",
    "randomized_combine", "randomized_minimax_value", "reduce_class", "sparse_multiclass",
    "thresholds", "verify_lcll_tree", "water_filling", "worst_case_mistakes", "worst_prior_value",
]
