"""Tests for the transductive-online chapter: exact game values, learners, trees, bad input."""

import itertools
from fractions import Fraction

import numpy as np
import pytest
from scipy.optimize import linprog

import icml26.transductive_online as to


def random_class(rng, n_points, max_rows=7, n_labels=3):
    rows = rng.integers(1, max_rows + 1)
    return to.finite_class(rng.integers(0, n_labels, size=(rows, n_points)))


# --- brute force over every deterministic learner ------------------------------------------


def decision_nodes(matrix):
    """Realizable label prefixes after which the version space still splits, with the labels
    it allows there (the only rounds where a learner's choice can matter)."""
    nodes, frontier = [], [((), np.arange(len(matrix)))]
    for t in range(matrix.shape[1]):
        nxt = []
        for prefix, rows in frontier:
            labels = np.unique(matrix[rows, t])
            if len(labels) > 1:
                nodes.append(((t, prefix), [int(y) for y in labels] + [-1]))  # -1: any other
            nxt += [(prefix + (int(y),), rows[matrix[rows, t] == y]) for y in labels]
        frontier = nxt
    return nodes


def brute_force_minimax(matrix):
    """min over all deterministic learners of max over targets of mistakes, by enumeration.

    On a round where the version space agrees, predicting its label is optimal whatever else the
    learner does (labels never depend on predictions), so only split rounds are enumerated."""
    nodes = decision_nodes(matrix)
    targets = np.unique(matrix, axis=0)
    best = None
    for choice in itertools.product(*(options for _, options in nodes)):
        policy = {key: y for (key, _), y in zip(nodes, choice, strict=True)}
        worst = 0
        for target in targets:
            mistakes, prefix = 0, ()
            for t, y in enumerate(target):
                guess = policy.get((t, prefix), int(y))
                mistakes += guess != y
                prefix += (int(y),)
            worst = max(worst, mistakes)
        best = worst if best is None else min(best, worst)
    return best


def test_recursion_matches_brute_force_over_all_deterministic_learners():
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(40):
        cls = random_class(rng, n_points=int(rng.integers(1, 6)), max_rows=6)
        if len(decision_nodes(cls.matrix)) > 7:
            continue
        assert to.minimax_mistakes(cls) == brute_force_minimax(cls.matrix)
        checked += 1
    assert checked >= 25


# --- known values ----------------------------------------------------------------------------


@pytest.mark.parametrize("m", range(1, 9))
def test_dyadic_thresholds_on_2_to_the_m_minus_1_points(m):
    cls = to.thresholds(to.dyadic_points(2**m - 1))
    assert cls.n_hypotheses == 2**m
    assert to.minimax_mistakes(cls) == m
    assert to.randomized_minimax_value(cls) == Fraction(m, 2)


@pytest.mark.parametrize("n", range(1, 9))
def test_all_functions_give_n_and_n_over_2(n):
    cls = to.all_functions(n)
    assert to.minimax_mistakes(cls) == n
    assert to.randomized_minimax_value(cls) == Fraction(n, 2)


def test_all_functions_with_k_labels_give_n_times_one_minus_one_over_k():
    for k in (3, 4):
        assert to.randomized_minimax_value(to.all_functions(3, k)) == 3 * Fraction(k - 1, k)


@pytest.mark.parametrize("max_label", [1, 2, 5])
def test_sparse_multiclass_closed_forms(max_label):
    for n in range(1, 6):
        cls = to.sparse_multiclass(n, max_label)
        assert to.minimax_mistakes(cls) == 1
        assert to.randomized_minimax_value(cls) == 1 - Fraction(1, max_label + 1) ** n


def test_blocks_uniform_value_is_the_block_size():
    cls = to.disjoint_blocks([1, 2, 3, 5])
    block5 = [i for i, (d, _) in enumerate(cls.points) if d == 5]
    assert to.minimax_mistakes(cls.restrict(block5)) == 5
    enumeration = list(range(cls.n_points))  # blocks listed one after the other
    assert to.minimax_mistakes(cls.restrict(enumeration)) == 5


def test_thresholds_dimensions():
    cls = to.thresholds(range(8))
    assert to.level_constrained_dimension(cls)[0] == 1
    assert to.littlestone_dimension(cls) == 3
    assert to.level_constrained_branching(cls)[0] == 3


# --- water-filling and the randomized value -------------------------------------------------


def test_water_filling_matches_a_linear_program():
    rng = np.random.default_rng(1)
    for _ in range(50):
        values = [Fraction(int(v), 4) for v in rng.integers(0, 12, size=rng.integers(1, 6))]
        level, p = to.water_filling(values)
        k = len(values)
        # variables (p_1..p_k, z): minimize z s.t. 1 - p_y + v_y <= z, sum p = 1, p >= 0
        result = linprog(np.r_[np.zeros(k), 1.0],
                         A_ub=np.c_[-np.eye(k), -np.ones(k)], b_ub=-1 - np.array(values, float),
                         A_eq=np.r_[np.ones(k), 0.0][None], b_eq=[1.0],
                         bounds=[(0, None)] * k + [(None, None)])
        assert float(level) == pytest.approx(result.fun, abs=1e-9)
        assert sum(p) == 1 and min(p) >= 0
        assert max(1 - py + v for py, v in zip(p, values, strict=True)) == level


def test_randomized_value_sits_between_half_and_all_of_the_deterministic_value():
    rng = np.random.default_rng(2)
    for _ in range(40):
        cls = random_class(rng, n_points=int(rng.integers(1, 7)), max_rows=10)
        deterministic = to.minimax_mistakes(cls)
        randomized = to.randomized_minimax_value(cls)
        assert Fraction(deterministic, 2) <= randomized <= deterministic


# --- memoization -----------------------------------------------------------------------------


def test_memoized_and_plain_recursions_agree_and_memo_saves_work():
    rng = np.random.default_rng(3)
    for _ in range(30):
        cls = random_class(rng, n_points=int(rng.integers(1, 8)), max_rows=12)
        memo, plain = to.MinimaxSolver(), to.MinimaxSolver(memoize=False)
        assert memo.deterministic(cls) == plain.deterministic(cls)
        assert memo.randomized(cls) == plain.randomized(cls)
    memo, plain = to.MinimaxSolver(), to.MinimaxSolver(memoize=False)
    assert memo.deterministic(to.all_functions(10)) == plain.deterministic(to.all_functions(10))
    assert memo.expanded == 10 and plain.expanded == 2**10 - 1


def test_reduction_keeps_the_value():
    """Permuting labels within a column, duplicating rows and adding constant columns change
    nothing (Eq. eq-reduction)."""
    rng = np.random.default_rng(4)
    for _ in range(30):
        cls = random_class(rng, n_points=5, max_rows=8)
        matrix = cls.matrix.copy()
        matrix[:, 2] = (7 - 3 * matrix[:, 2]) ** 2  # an injective renaming of the labels
        matrix = np.c_[np.full(len(matrix), 9), matrix, np.zeros(len(matrix), int)]
        matrix = np.r_[matrix, matrix[:1]]
        assert to.minimax_mistakes(matrix) == to.minimax_mistakes(cls)
        assert to.randomized_minimax_value(matrix) == to.randomized_minimax_value(cls)


def test_appending_points_never_lowers_the_value_but_prepending_can():
    rng = np.random.default_rng(5)
    for _ in range(60):
        cls = random_class(rng, n_points=5, max_rows=8)
        for cut in range(1, 5):
            assert to.minimax_mistakes(cls.matrix[:, :cut]) <= to.minimax_mistakes(cls)
    example = np.array([[1, 0, 2, 0, 0], [1, 0, 0, 1, 0], [1, 2, 0, 0, 1], [2, 2, 0, 1, 1]])
    assert to.minimax_mistakes(example) == 1 < to.minimax_mistakes(example[:, 1:]) == 2


# --- learners and the adversary --------------------------------------------------------------


def test_minimax_learner_attains_the_value_and_the_adversary_forces_it():
    rng = np.random.default_rng(6)
    for _ in range(25):
        cls = random_class(rng, n_points=int(rng.integers(1, 7)), max_rows=10)
        value = to.minimax_mistakes(cls)
        assert to.worst_case_mistakes(to.MinimaxLearner(), cls) == value
        assert to.play_adversary(to.MinimaxLearner(), cls).total == value
        assert to.play_adversary(to.HalvingLearner(), cls).total >= value
        assert to.worst_case_mistakes(to.HalvingLearner(), cls) >= value


def test_randomized_learner_expected_mistakes_equal_the_value_on_the_worst_target():
    rng = np.random.default_rng(7)
    for _ in range(15):
        cls = random_class(rng, n_points=int(rng.integers(1, 6)), max_rows=8)
        value = to.randomized_minimax_value(cls)
        learner = to.RandomizedMinimaxLearner()
        expected = [to.play(learner, cls, row, rng).expected_total for row in cls.matrix]
        assert max(expected) == value
        assert to.play_adversary(to.RandomizedMinimaxLearner(), cls).expected_total == value


def test_randomized_learner_sampled_mistakes_average_to_the_expectation():
    cls = to.all_functions(6)
    rng = np.random.default_rng(8)
    learner, target = to.RandomizedMinimaxLearner(), cls.matrix[37]
    totals = [to.play(learner, cls, target, rng).total for _ in range(400)]
    # each round is a fair coin: mean 3, standard error sqrt(1.5 / 400) ~ 0.06
    assert abs(np.mean(totals) - 3) < 0.25


def test_halving_attains_the_dyadic_value_and_its_epoch_bound():
    for m in range(1, 8):
        cls = to.thresholds(to.dyadic_points(2**m - 1))
        assert to.worst_case_mistakes(to.HalvingLearner(), cls) == m
    rng = np.random.default_rng(9)
    for _ in range(20):
        cls = random_class(rng, n_points=11, max_rows=40, n_labels=2)
        for target in cls.matrix:
            mistakes = to.play(to.HalvingLearner(), cls, target).mistakes
            version = np.arange(cls.n_hypotheses)
            for j in range(4):  # epochs [2^j, 2^(j+1)) of rounds counted from 1
                first, last = 2**j - 1, min(2 ** (j + 1) - 1, cls.n_points)
                patterns = np.unique(cls.matrix[version][:, first:last], axis=0)
                before = mistakes[first - 1] if first else 0
                assert mistakes[last - 1] - before <= np.log2(len(patterns))
                agree = (cls.matrix[version][:, first:last] == target[first:last]).all(axis=1)
                version = version[agree]


def test_memorizing_learner_stays_within_the_block_size():
    cls = to.disjoint_blocks([1, 2, 3])
    for target in cls.matrix:
        support = [cls.points[i][0] for i in np.flatnonzero(target)]
        d = support[0] if support else 0
        for sequence in itertools.product(range(cls.n_points), repeat=4):
            restricted = cls.restrict(sequence)
            result = to.play(to.MemorizingLearner(), restricted, target[list(sequence)])
            assert result.total <= d


# --- level-constrained trees and the LCLL search ---------------------------------------------


def vc_dimension(matrix):
    for d in range(matrix.shape[1], 0, -1):
        for columns in itertools.combinations(range(matrix.shape[1]), d):
            if len(np.unique(matrix[:, columns], axis=0)) == 2**d:
                return d
    return 0


def test_binary_level_constrained_dimension_is_the_vc_dimension():
    rng = np.random.default_rng(10)
    for _ in range(30):
        cls = random_class(rng, n_points=int(rng.integers(1, 7)), max_rows=20, n_labels=2)
        assert to.level_constrained_dimension(cls)[0] == vc_dimension(cls.matrix)


def test_multiclass_dimension_search_matches_exhaustive_orders():
    rng = np.random.default_rng(11)
    for _ in range(20):
        cls = random_class(rng, n_points=4, max_rows=14, n_labels=3)
        exhaustive = max([0] + [len(order) for d in range(1, 5)
                                for order in itertools.permutations(range(4), d)
                                if to.level_constrained_tree(cls, order) is not None])
        dimension, order = to.level_constrained_dimension(cls)
        assert dimension == exhaustive
        assert dimension == 0 or to.level_constrained_tree(cls, order) is not None


def test_branching_on_a_domain_is_the_best_ordering():
    rng = np.random.default_rng(12)
    for _ in range(15):
        cls = random_class(rng, n_points=4, max_rows=10)
        best = max(to.minimax_mistakes(cls.matrix[:, list(order)])
                   for d in range(1, 5) for order in itertools.permutations(range(4), d))
        assert to.level_constrained_branching(cls)[0] == best
        assert to.level_constrained_dimension(cls)[0] <= best <= to.littlestone_dimension(cls)


@pytest.mark.parametrize(("k", "depth"), [(1, 1), (2, 1), (3, 2), (5, 2), (6, 3), (9, 3)])
def test_lcll_depth_of_all_functions(k, depth):
    """A depth-m LCLL tree needs 1 + 2 + ... + m fresh points along every path."""
    cls = to.all_functions(k)
    assert to.lcll_depth(cls, 4) == depth
    assert to.verify_lcll_tree(cls, to.find_lcll_tree(cls, depth), depth)


def test_lcll_depths_of_the_examples_and_block_confinement():
    assert to.lcll_depth(to.thresholds(range(8)), 3) == 1
    assert to.lcll_depth(to.sparse_multiclass(6, 3), 3) == 1
    cls = to.disjoint_blocks([1, 2, 3, 4, 5, 6])
    assert to.lcll_depth(cls, 4) == 3
    tree = to.find_lcll_tree(cls, 3)
    for path, _ in to.lc_paths(tree.tree):
        _, label = path[0]
        if label == 1:  # below a 1 every point of the witness lies in the root point's block
            block = cls.points[tree.tree.point][0]
            assert all(cls.points[p][0] == block for p in collect_points(tree.tree, label))


def collect_points(tree, first_label):
    """Every point used below the root edge ``first_label`` of an LCLL witness."""
    found, stack = [], [child for label, child in tree.branches if label == first_label]
    while stack:
        node = stack.pop()
        if isinstance(node, to.LCLLNode):
            stack.append(node.tree)
        elif isinstance(node, to.LCNode):
            found.append(node.point)
            stack.extend(child for _, child in node.branches)
    return found


def test_verify_rejects_broken_lcll_trees():
    cls = to.all_functions(3)
    tree = to.find_lcll_tree(cls, 2)
    assert to.verify_lcll_tree(cls, tree, 2)
    assert not to.verify_lcll_tree(cls, tree, 3)
    child = tree.tree.branches[1][1]
    swapped = to.LCLLNode(child.points[::-1], child.tree)  # breaks the level constraint
    broken = to.LCLLNode(tree.points, to.LCNode(tree.tree.point,
                                                (tree.tree.branches[0], (1, swapped))))
    assert not to.verify_lcll_tree(cls, broken, 2)
    sparse = to.finite_class(cls.matrix[:-1])  # 111 removed: one path is no longer consistent
    assert not to.verify_lcll_tree(sparse, tree, 2)


# --- bad input -------------------------------------------------------------------------------


def test_bad_input_raises_clear_errors():
    cls = to.thresholds(to.dyadic_points(3))  # points 1/2, 1/4, 3/4
    with pytest.raises(ValueError, match="round 3: the labels of rounds 1..3 are not realizable"):
        to.play(to.HalvingLearner(), cls, [1, 0, 0])  # 1 at 1/2 forces 1 at 3/4
    with pytest.raises(ValueError, match="round 2: label 5 is outside every hypothesis"):
        to.play(to.MinimaxLearner(), cls, [1, 5, 1])
    with pytest.raises(ValueError, match="the class is empty: no hypothesis can label round 1"):
        to.finite_class(np.zeros((0, 3), dtype=int))
    with pytest.raises(ValueError, match="the class is empty"):
        to.project([], [1, 2])
    with pytest.raises(ValueError, match="one label per round"):
        to.play(to.MinimaxLearner(), cls, [1, 1])
    with pytest.raises(TypeError, match="integers"):
        to.finite_class(np.array([[0.5, 1.0]]))
    with pytest.raises(TypeError, match="integers"):
        to.play(to.MinimaxLearner(), cls, [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="needs an rng"):
        to.play(to.RandomizedMinimaxLearner(), cls, [1, 1, 1])
    with pytest.raises(ValueError, match="not realizable"):
        to.reduce_class(np.zeros((0, 2), dtype=int))
    with pytest.raises(ValueError, match="block sizes"):
        to.disjoint_blocks([2, 2])
    with pytest.raises(TypeError, match="deterministic learner"):
        to.worst_case_mistakes(to.RandomizedMinimaxLearner(), cls)


def _bayes_risk(matrix, prior):
    """Least expected mistakes against targets drawn from ``prior``: predict the label with the
    largest posterior mass in every round (computed from the prior alone)."""
    from fractions import Fraction

    def risk(rows, t):
        if t == matrix.shape[1] or sum(prior[r] for r in rows) == 0:
            return Fraction(0)
        mass = {}
        for r in rows:
            mass[int(matrix[r, t])] = mass.get(int(matrix[r, t]), Fraction(0)) + prior[r]
        total = sum(mass.values())
        wrong = total - max(mass.values())
        return wrong + sum(risk([r for r in rows if matrix[r, t] == y], t + 1) for y in mass)

    return risk(list(range(len(matrix))), 0)


def test_worst_prior_attains_the_randomized_value():
    rng = np.random.default_rng(5)
    for _ in range(60):
        matrix = rng.integers(0, 3, size=(rng.integers(1, 10), rng.integers(1, 6)))
        value, prior = to.worst_prior_value(matrix)
        assert value == to.randomized_minimax_value(matrix)
        assert sum(prior) == 1 and all(p >= 0 for p in prior)
        assert _bayes_risk(matrix, prior) == value


def test_draw_game_tree_and_its_errors():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    to.draw_game_tree(ax, to.thresholds(to.dyadic_points(3)))
    assert len(ax.texts) > 0
    plt.close(fig)
    with pytest.raises(ValueError):
        to.draw_game_tree(ax, to.all_functions(7))
    with pytest.raises(ValueError):
        to.worst_prior_value(np.zeros((0, 2), dtype=int))
