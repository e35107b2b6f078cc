"""Exercise aniso-ex-frequency: gradient-energy enrichment per token-frequency bucket."""

import numpy as np

from icml26 import anisotropy as an

OK_FORMAT = False
name = "aniso-ex-frequency"
points = 3


def test_one_bucket_is_the_overall_enrichment(enrichment_by_frequency, rng):
    G = rng.standard_normal((200, 10))
    Q = an.orthonormal_basis(rng.standard_normal((3, 10)))
    tokens = rng.integers(0, 5, size=200)
    frequencies = rng.dirichlet(np.ones(5))
    result = np.asarray(enrichment_by_frequency(G, Q, tokens, frequencies, 1))
    assert result.shape == (1,)
    assert abs(result[0] - an.energy_share(G, Q) / 0.3) < 1e-10


def test_buckets_are_ordered_rarest_first(enrichment_by_frequency):
    rng = np.random.default_rng(1)
    d, k = 12, 3
    Q = an.orthonormal_basis(rng.standard_normal((k, d)))
    frequencies = np.array([0.05, 0.15, 0.3, 0.5])
    tokens = np.repeat(np.arange(4), 50)
    rng.shuffle(tokens)
    G = rng.standard_normal((200, d))
    frequent = tokens == 3
    G[frequent] = rng.standard_normal((frequent.sum(), k)) @ Q.T  # all energy in span Q
    result = np.asarray(enrichment_by_frequency(G, Q, tokens, frequencies, 4))
    assert result.shape == (4,)
    assert abs(result[-1] - d / k) < 1e-9, f"the most frequent bucket should be d/k: {result}"
    assert (result[:-1] < 2).all(), f"the other buckets are random: {result}"
