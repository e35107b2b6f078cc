"""Exercise sfp-ex-bon: best-of-n choice probabilities depend on ranks only."""

import numpy as np

from icml26.fictitious_play import bon_choice_probabilities

OK_FORMAT = False
name = "sfp-ex-bon"
points = 3


def test_bon_probabilities_match_the_library_and_monte_carlo(bon_probabilities):
    rng = np.random.default_rng(21)
    base = rng.dirichlet(np.ones(7))
    scores = rng.normal(size=7)
    for n in (1, 3, 8):
        p = np.asarray(bon_probabilities(base, scores, n), dtype=float)
        assert abs(p.sum() - 1) < 1e-12
        assert np.allclose(p, bon_choice_probabilities(base, scores, n), atol=1e-12)
    draws = rng.choice(7, size=(20000, 3), p=base)
    picks = draws[np.arange(20000), np.argmax(scores[draws], axis=1)]
    freq = np.bincount(picks, minlength=7) / 20000
    p3 = np.asarray(bon_probabilities(base, scores, 3))
    assert np.all(np.abs(freq - p3) < 5 * np.sqrt(p3 * (1 - p3) / 20000) + 1e-9)


def test_rank_invariance_and_kl_budget(bon_probabilities):
    base = np.array([0.25, 0.25, 0.3, 0.2])
    scores = np.array([1.0, -2.0, 0.5, 3.0])
    p = np.asarray(bon_probabilities(base, scores, 5))
    assert np.allclose(p, bon_probabilities(base, scores**3 + 7, 5))
    kl = np.sum(p * np.log(p / base))
    assert kl <= np.log(5) - 4 / 5 + 1e-12
