"""Exercise tol-ex-lower: the dyadic lower bound, one fair coin per level."""

import numpy as np

import icml26.transductive_online as to

OK_FORMAT = False
name = "tol-ex-lower"
points = 3


def test_special_rounds_are_the_only_unforced_point_of_each_level(special_rounds, rng):
    levels = 5
    cls = to.thresholds(to.dyadic_points(2**levels - 1))
    values = np.sort([float(p) for p in cls.points])
    thetas = rng.uniform(0, 1, 50)
    for theta, specials in zip(thetas, special_rounds.map((levels, t) for t in thetas),
                               strict=True):
        target = cls.matrix[np.searchsorted(values, theta)]
        for j in range(1, levels + 1):
            before = 2 ** (j - 1) - 1
            version = (cls.matrix[:, :before] == target[:before]).all(axis=1)
            level = range(before, 2**j - 1)
            unforced = [t for t in level if len(np.unique(cls.matrix[version, t])) == 2]
            assert unforced == [specials[j - 1]], f"level {j}, theta = {theta:.3f}"


class AlwaysOne:
    """A deliberately poor deterministic learner: it predicts label 1 in every round."""

    def reset(self, cls):
        pass

    def predict(self, t):
        return 1

    def update(self, t, y):
        pass


def test_level_mistakes_are_fair_independent_coins(level_mistakes):
    trials = 400
    for make in (to.HalvingLearner, to.MinimaxLearner, to.RandomizedMinimaxLearner, AlwaysOne):
        rng = np.random.default_rng(1)  # fixed: a fair coin must pass at four standard errors
        calls = [(make(), 4, theta, np.random.default_rng(rng.integers(2**32)))
                 for theta in rng.uniform(0, 1, trials)]
        Z = np.array(level_mistakes.map(calls), dtype=float)
        assert Z.shape == (trials, 4), f"one indicator per level, got shape {Z.shape[1:]}"
        assert np.all(np.abs(Z.mean(axis=0) - 0.5) < 4 * np.sqrt(0.25 / trials)), make.__name__
        correlations = np.corrcoef(Z.T)[np.triu_indices(4, 1)]
        assert np.all(np.abs(correlations) < 4 / np.sqrt(trials)), make.__name__
