"""Tests for the synthetic Markov languages: exact entropy rate, stationarity, determinism."""

import numpy as np
import pytest
from scipy import stats

from icml26.language import (
    make_corpus,
    plackett_luce_rankings,
    row_entropies,
    source_with_entropy_rate,
    stationary_distribution,
    zipf_markov_source,
)


@pytest.fixture(scope="module")
def source():
    return zipf_markov_source(vocab_size=12, order=2, exponent=1.1, temperature=0.8, spread=0.7,
                              seed=3)


def dense_context_chain(source):
    """The V^k x V^k transition matrix of the context chain, built entry by entry."""
    V, C = source.vocab_size, source.num_contexts
    chain = np.zeros((C, C))
    for c in range(C):
        for j in range(V):
            chain[c, (c * V) % C + j] += source.transition[c, j]
    return chain


def test_rows_are_distributions_with_zipf_ratios():
    src = zipf_markov_source(vocab_size=10, order=1, exponent=1.5, temperature=0.5, spread=0.0,
                             seed=0)
    np.testing.assert_allclose(src.transition.sum(1), 1, atol=1e-12)
    sorted_rows = -np.sort(-src.transition, axis=1)
    ranks = np.arange(1, 11)
    expected = ranks ** (-1.5 / 0.5) / (ranks ** (-1.5 / 0.5)).sum()
    np.testing.assert_allclose(sorted_rows, np.tile(expected, (10, 1)), rtol=1e-12)


def test_stationary_distribution_matches_the_dense_eigenvector(source):
    chain = dense_context_chain(source)
    values, vectors = np.linalg.eig(chain.T)
    top = vectors[:, np.argmin(np.abs(values - 1))].real
    np.testing.assert_allclose(source.stationary, top / top.sum(), atol=1e-12)
    np.testing.assert_allclose(source.stationary @ chain, source.stationary, atol=1e-14)


def test_entropy_rate_is_the_stationary_average_of_row_entropies(source):
    direct = sum(source.stationary[c] * -np.sum(row * np.log(row))
                 for c, row in enumerate(source.transition))
    assert source.entropy_rate == pytest.approx(direct, rel=1e-12)
    assert source.perplexity_floor == pytest.approx(np.exp(direct), rel=1e-12)
    # with spread > 0 the rows differ, so a uniform average would be wrong
    assert abs(row_entropies(source.transition).mean() - source.entropy_rate) > 1e-3


def test_exact_entropy_rate_matches_a_long_sample(source):
    tokens = source.sample(4000, 60, seed=11)
    per_sequence = -source.log_prob(tokens).mean(axis=1)  # independent sequences
    standard_error = per_sequence.std(ddof=1) / np.sqrt(len(per_sequence))
    assert abs(per_sequence.mean() - source.entropy_rate) < 4 * standard_error
    assert standard_error < 0.01


def test_plug_in_conditional_entropy_converges_to_the_rate():
    src = zipf_markov_source(vocab_size=6, order=1, temperature=1.2, seed=4)
    tokens = src.sample(2000, 200, seed=5)
    pairs = np.bincount((tokens[:, :-1] * 6 + tokens[:, 1:]).ravel(), minlength=36)
    joint = pairs.reshape(6, 6) / pairs.sum()
    conditional = joint / joint.sum(1, keepdims=True)
    plug_in = -(joint * np.log(conditional)).sum()
    assert plug_in == pytest.approx(src.entropy_rate, abs=0.005)


def test_samples_are_stationary_at_every_position(source):
    tokens = source.sample(6000, 40, seed=2)
    expected = source.unigram * len(tokens)
    for position in (0, 1, 2, 39):
        observed = np.bincount(tokens[:, position], minlength=source.vocab_size)
        assert stats.chisquare(observed, expected).pvalue > 1e-4, position
    contexts = source.encode(tokens[:, 20:22])
    observed = np.bincount(contexts, minlength=source.num_contexts)
    big = source.stationary * len(tokens) > 20
    assert stats.chisquare(observed[big], source.stationary[big] * len(tokens)
                           * observed[big].sum() / (source.stationary[big] * len(tokens)).sum()
                           ).pvalue > 1e-4


def test_log_prob_reads_the_transition_table(source):
    tokens = source.sample(3, 9, seed=0)
    log_p = source.log_prob(tokens)
    assert log_p.shape == (3, 7)
    V = source.vocab_size
    for row in range(3):
        for t in range(2, 9):
            context = tokens[row, t - 2] * V + tokens[row, t - 1]
            assert log_p[row, t - 2] == np.log(source.transition[context, tokens[row, t]])


def test_determinism_and_seed_sensitivity():
    a = zipf_markov_source(16, 2, seed=7)
    b = zipf_markov_source(16, 2, seed=7)
    np.testing.assert_array_equal(a.transition, b.transition)
    np.testing.assert_array_equal(a.sample(5, 20, seed=1), b.sample(5, 20, seed=1))
    assert not np.array_equal(a.sample(5, 20, seed=1), a.sample(5, 20, seed=2))
    assert not np.array_equal(a.transition, zipf_markov_source(16, 2, seed=8).transition)


def test_corpus_splits_are_deterministic_and_independent_of_the_train_size(source):
    small = make_corpus(source, 640, 320, length=32, seed=4)
    large = make_corpus(source, 6400, 320, length=32, seed=4)
    assert small.train.shape == (20, 32) and small.test.shape == (10, 32)
    assert small.valid.shape == (10, 32)
    np.testing.assert_array_equal(small.test, large.test)
    np.testing.assert_array_equal(small.valid, large.valid)
    assert not np.array_equal(small.test, small.valid)
    again = make_corpus(source, 640, 320, length=32, seed=4)
    np.testing.assert_array_equal(small.train, again.train)


def test_temperature_is_an_entropy_knob():
    rates = [zipf_markov_source(16, 2, temperature=t, seed=1).entropy_rate
             for t in (0.3, 0.6, 1.0, 2.0, 5.0)]
    assert all(np.diff(rates) > 0)
    assert rates[-1] < np.log(16)
    src = source_with_entropy_rate(1.5, vocab_size=16, order=2, seed=1)
    assert src.entropy_rate == pytest.approx(1.5, abs=1e-4)


def test_plackett_luce_ranks_are_permutations_favouring_popular_symbols():
    ranks = plackett_luce_rankings(np.random.default_rng(0), 2000, 8, exponent=2.0)
    assert (np.sort(ranks, axis=1) == np.arange(1, 9)).all()
    mean_rank = ranks.mean(0)
    assert (np.diff(mean_rank) > 0).all()  # symbol 0 is the most popular


def test_stationary_distribution_of_an_order_one_chain():
    transition = np.array([[0.9, 0.1], [0.4, 0.6]])
    np.testing.assert_allclose(stationary_distribution(transition, 1), [0.8, 0.2], atol=1e-14)


@pytest.mark.parametrize("kwargs, error", [
    (dict(vocab_size=1), ValueError), (dict(order=0), ValueError),
    (dict(temperature=0.0), ValueError), (dict(exponent=-1.0), ValueError),
    (dict(vocab_size=2.5), TypeError), (dict(spread=-0.1), ValueError),
    (dict(vocab_size=4096, order=2), ValueError),
])
def test_bad_parameters_are_refused(kwargs, error):
    with pytest.raises(error):
        zipf_markov_source(**kwargs)


def test_bad_tokens_and_targets_are_refused(source):
    with pytest.raises(ValueError, match="lie in"):
        source.log_prob(np.full((2, 5), source.vocab_size))
    with pytest.raises(ValueError, match="2-D"):
        source.log_prob(np.zeros(5, dtype=int))
    with pytest.raises(ValueError, match="below log"):
        source_with_entropy_rate(10.0, vocab_size=16)
    with pytest.raises(ValueError):
        source.sample(0, 10, seed=0)


@pytest.mark.parametrize("seed", [3, 4, 6, 7, 8, 9])
def test_near_deterministic_sources_reach_their_target_entropy(seed):
    """Low temperatures once stalled a power iteration; the exact solve must not."""
    source = source_with_entropy_rate(2.0, vocab_size=64, order=1, seed=seed)
    assert source.entropy_rate == pytest.approx(2.0, abs=1e-5)
    assert source.stationary.min() > 0 and source.stationary.sum() == pytest.approx(1.0)
