"""Exercise aniso-ex-collision: the mean cosine explained by token identity and frequency."""

import numpy as np

from icml26 import anisotropy as an

OK_FORMAT = False
name = "aniso-ex-collision"
points = 2


def test_orthogonal_types_give_the_collision_probability(predicted_mean_cosine):
    q = np.random.default_rng(0).dirichlet(np.ones(7))
    types = 3.0 * np.eye(7)
    value = float(predicted_mean_cosine(types, q))
    assert abs(value - q @ q) < 1e-12, f"expected sum q^2 = {q @ q}, got {value}"


def test_matches_a_large_sample(predicted_mean_cosine):
    rng = np.random.default_rng(1)
    q = rng.dirichlet(np.full(12, 0.7))
    types = rng.standard_normal((12, 5)) + 0.5
    tokens = rng.choice(12, size=6000, p=q)
    sampled = an.mean_cosine(types[tokens] * rng.uniform(0.5, 2.0, size=(6000, 1)))
    value = float(predicted_mean_cosine(types, q))
    assert abs(value - sampled) < 0.02, f"prediction {value} vs sample {sampled}"
