"""Exercise sfp-ex-counter: the expected gain of taking a counter-offer at the deadline."""

import numpy as np

from icml26.fictitious_play import bargaining as ao

OK_FORMAT = False
name = "sfp-ex-counter"
points = 2


def test_counter_gain_matches_the_exact_utility(counter_gain):
    game = ao.AlternatingGame(rounds=1)
    for a, mu, spread in ((0.5, 0.6, 0.05), (0.9, 0.4, 0.1), (0.3, 0.95, 0.02), (1.0, 0.7, 0.2)):
        exact = ao.plan_utility(game, np.zeros((1, 1)), np.array([a]), np.zeros((1, 1)),
                                np.full((1, 1), mu), spread)[0]
        assert abs(float(counter_gain(a, mu, spread)) - exact) < 1e-10, (a, mu, spread)
    assert abs(float(counter_gain(0.9, 0.4, 0.1, value=2.0))
               - (1.6 * 1.0 + 0.1 * np.exp(-12.5) / np.sqrt(2 * np.pi))) < 1e-6, "use value"


def test_counter_gain_against_played_counters_and_its_maximiser(counter_gain):
    rng = np.random.default_rng(31)
    c = 0.6 + 0.08 * rng.standard_normal(400_000)
    played = np.where(c <= 0.65, 1.0 - c, 0.0)
    se = played.std() / np.sqrt(c.size)
    assert abs(played.mean() - float(counter_gain(0.65, 0.6, 0.08))) < 4 * se
    grid = np.linspace(0.3, 1.5, 1201)
    best = grid[int(np.argmax([float(counter_gain(a, 0.6, 0.08)) for a in grid]))]
    assert abs(best - 1.0) < 2e-3, "at the deadline the best threshold is the value"
