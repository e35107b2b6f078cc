"""Tests for the dual-steering chapter: exponential family, map back, theorem, steering."""

import math

import numpy as np
import pytest
import torch
from scipy.special import expit, logsumexp

from icml26 import dual_steering as ds


def head(V=15, d=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((V, d)), rng.standard_normal(d)


def test_gradient_of_log_partition_is_the_mean_parameter():
    G, lam = head()
    eps = 1e-6
    fd = np.array([(ds.log_partition(G, lam + eps * e) - ds.log_partition(G, lam - eps * e))
                   / (2 * eps) for e in np.eye(4)])
    assert np.allclose(fd, ds.mean_parameter(G, lam), atol=1e-8)


def test_fisher_metric_is_the_hessian_of_log_partition_in_torch():
    G, lam = head(seed=1)
    Gt = torch.tensor(G)
    hess = torch.func.hessian(lambda x: torch.logsumexp(Gt @ x, 0))(torch.tensor(lam))
    assert np.allclose(hess.numpy(), ds.fisher_metric(G, lam), atol=1e-10)
    batch = np.stack([lam, 2 * lam])
    assert np.allclose(ds.fisher_metric(G, batch)[1], ds.fisher_metric(G, 2 * lam))


def test_bregman_divergence_is_kl_in_the_reverse_order():
    G, lam = head(seed=2)
    other = lam + np.random.default_rng(3).standard_normal(4)
    kl = ds.kl_divergence(ds.probabilities(G, lam), ds.probabilities(G, other))
    assert np.isclose(ds.bregman_divergence(G, other, lam), kl, atol=1e-12)
    assert ds.bregman_divergence(G, other, lam) > 0


def test_map_back_matches_the_multinomial_logit_closed_form():
    d = 3
    G = np.vstack([np.zeros(d), np.eye(d)])  # p(0) ∝ 1, p(i) ∝ exp(lam_i)
    mu = np.array([0.2, 0.1, 0.3])
    closed = np.log(mu / (1 - mu.sum()))
    for method in ("lbfgs", "newton"):
        lam = ds.dual_to_primal(G, mu, method=method)
        assert np.allclose(lam, closed, atol=1e-6), method


def test_map_back_inverts_the_mean_map_and_rejects_unattainable_means():
    G, lam = head(seed=4)
    mu = ds.mean_parameter(G, lam)
    assert np.allclose(ds.dual_to_primal(G, mu), lam, atol=1e-5)
    assert ds.hull_margin(G, mu) > 0
    outside = G.max(axis=0) + 1.0
    assert ds.hull_margin(G, outside) < 0
    with pytest.raises(ValueError, match="attainable"):
        ds.dual_to_primal(G, outside)


def test_primal_interpolation_is_a_geometric_mixture_and_dual_a_mean_mixture():
    G, lam0 = head(seed=5)
    lam1 = lam0 + 2 * np.random.default_rng(6).standard_normal(4)
    p0, p1 = ds.probabilities(G, lam0), ds.probabilities(G, lam1)
    s = np.array([0.0, 0.3, 0.7, 1.0])
    geo = p0 ** (1 - s[:, None]) * p1 ** s[:, None]
    assert np.allclose(ds.primal_interpolation(G, lam0, lam1, s), geo / geo.sum(1, keepdims=True))
    dual = ds.dual_interpolation(G, lam0, lam1, s)
    mix_mean = ((1 - s[:, None]) * p0 + s[:, None] * p1) @ G
    assert np.allclose(dual @ G, mix_mean, atol=1e-8)
    assert np.allclose(dual[0], p0, atol=1e-8) and np.allclose(dual[-1], p1, atol=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_kl_projection_lies_on_the_dual_line_and_satisfies_pythagoras(seed):
    G, lam0 = head(V=20, d=5, seed=seed)
    rng = np.random.default_rng(seed + 10)
    w = rng.standard_normal(5)
    level = float(w @ lam0 + 1.5)
    star = ds.kl_projection(G, lam0, w, level)
    assert np.isclose(w @ star, level)
    assert ds.dual_line_residual(G, lam0, star, w) < 1e-5
    p0, ps = ds.probabilities(G, lam0), ds.probabilities(G, star)
    for _ in range(5):  # any other point with the same probe value
        v = rng.standard_normal(5)
        other = star + 3 * (v - (v @ w) / (w @ w) * w)
        assert abs(ds.pythagorean_residual(G, lam0, star, other)) < 1e-7
        assert ds.kl_divergence(p0, ps) <= ds.kl_divergence(p0, ds.probabilities(G, other))


def test_parallel_pairs_make_the_ratio_a_sigmoid_of_the_pair_probe():
    G, lam = head(V=12, d=4, seed=7)
    base, target = np.arange(4), np.arange(4, 8)
    Gs = ds.pair_spread_head(G, base, target, 0.0)
    delta = ds.pair_direction(Gs, base, target)
    lams = np.random.default_rng(8).standard_normal((10, 4))
    ratio = ds.target_ratio(ds.probabilities(Gs, lams), base, target)
    assert np.allclose(ratio, expit(lams @ delta))
    assert np.allclose(ds.pair_spread_head(G, base, target, 1.0), G)


def test_merged_kl_ignores_moves_within_pairs():
    base, target = np.array([0, 1]), np.array([2, 3])
    p0 = np.array([0.3, 0.1, 0.1, 0.2, 0.3])
    p = np.array([0.1, 0.05, 0.3, 0.25, 0.3])  # same pair totals, same rest
    assert np.isclose(ds.offtarget_kl(p0, p, base, target), 0.0)
    assert ds.kl_divergence(p0, p) > 0
    assert np.isclose(ds.target_ratio(p0, base, target), 0.3 / 0.7)
    assert ds.rank_change(p0, p, base, target) == 0


def test_steering_reaches_the_ratio_and_follows_its_geometry():
    rng = np.random.default_rng(9)
    G = rng.standard_normal((16, 4))
    base, target = np.arange(5), np.arange(5, 10)
    w = ds.pair_direction(G, base, target)
    lam0 = rng.standard_normal((6, 4)) - 2 * w / np.linalg.norm(w)
    for alpha in (math.inf, 0.0, 0.1):
        res = ds.steer_to_ratio(G, lam0, w, base, target, ratio=0.8, alpha=alpha, step=0.05,
                                max_steps=3000)
        r = ds.target_ratio(ds.probabilities(G, res.lam), base, target)
        assert np.allclose(r[res.reached], 0.8, atol=1e-6)
        assert res.reached.any()
        if alpha == math.inf:  # a straight line along w
            moved = res.lam - lam0
            assert np.allclose(moved - (moved @ w)[:, None] * w / (w @ w), 0, atol=1e-9)
        if alpha == 0.0:  # the mean moves along w
            for i in np.flatnonzero(res.reached):
                assert ds.dual_line_residual(G, lam0[i], res.lam[i], w) < 1e-3


def test_dual_beats_euclidean_at_matched_ratio_when_pairs_are_parallel():
    """The theorem's consequence (Eq. eq-dst-parallel): exact for parallel pairs and w = delta."""
    rng = np.random.default_rng(11)
    G = ds.pair_spread_head(rng.standard_normal((20, 5)), np.arange(6), np.arange(6, 12), 0.0)
    base, target = np.arange(6), np.arange(6, 12)
    w = ds.pair_direction(G, base, target)
    lam0 = rng.standard_normal((8, 5)) - 1.5 * w / np.linalg.norm(w)
    p0 = ds.probabilities(G, lam0)
    kls = {}
    for alpha in (0.0, math.inf):
        res = ds.steer_to_ratio(G, lam0, w, base, target, alpha=alpha, step=0.05, max_steps=4000)
        assert res.reached.all()
        kls[alpha] = ds.offtarget_kl(p0, ds.probabilities(G, res.lam), base, target)
    assert np.all(kls[0.0] <= kls[math.inf] + 1e-6)


def test_bad_input_raises_clear_errors():
    G, lam = head()
    base, target = np.arange(3), np.arange(3, 6)
    with pytest.raises(ValueError, match="zero norm"):
        ds.steer_to_ratio(G, lam, np.zeros(4), base, target)
    with pytest.raises(ValueError, match="strictly between"):
        ds.steer_to_ratio(G, lam, np.ones(4), base, target, ratio=1.0)
    with pytest.raises(ValueError, match="width"):
        ds.probabilities(G, np.ones(5))
    with pytest.raises(ValueError, match="width"):
        ds.steering_direction(G, np.ones((2, 3)), np.ones(4), 0.0)
    with pytest.raises(ValueError, match="zero norm"):
        ds.kl_projection(G, lam, np.zeros(4), 1.0)
    with pytest.raises(ValueError, match="NaN"):
        ds.mean_parameter(G, np.full(4, np.nan))
    with pytest.raises(ValueError, match="distinct"):
        ds.target_ratio(np.full(15, 1 / 15), [0, 1], [1, 2])
    with pytest.raises(ValueError, match="alpha"):
        ds.steering_direction(G, lam, np.ones(4), -1.0)


def test_large_representations_do_not_overflow():
    G, lam = head()
    big = 1e4 * lam
    assert np.isfinite(ds.log_partition(G, big))
    assert np.isclose(ds.log_partition(G, big), logsumexp(G @ big))
    assert np.all(np.isfinite(ds.fisher_metric(G, big)))


def test_language_and_training():
    lang = ds.BilingualLanguage(n_verbs=6, n_topics=3, seed=0)
    ctx, nxt, z, topics = lang.sample(500, np.random.default_rng(0))
    assert ctx.shape == (500, lang.max_context) and nxt.max() < lang.vocab_size
    verbs = nxt < 2 * lang.n_verbs
    assert np.all((nxt[verbs] >= lang.n_verbs) == (z[verbs] == 1))  # the next verb's form is z
    assert np.all(ctx[:, 0] != lang.pad)
    model, losses = ds.train_bag_model(lang, d=4, steps=150, seed=0)
    assert np.mean(losses[-20:]) < np.mean(losses[:5]) - 0.3
    X = ds.representations(model, ctx)
    assert X.shape == (500, 4)
    w, b = ds.logistic_probe(X, z)
    assert ds.probe_accuracy(X, z, w, b) > 0.6
    assert np.dot(ds.mean_difference_probe(X, z), w) > 0


def test_logistic_probe_matches_scikit_learn():
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(12)
    X = rng.standard_normal((300, 5))
    y = (X @ np.array([1.0, -2.0, 0.5, 0.0, 1.0]) + 0.3 + rng.standard_normal(300) > 0).astype(int)
    for C in (0.1, 1.0):
        w, b = ds.logistic_probe(X, y, C=C)
        ref = LogisticRegression(C=C, tol=1e-12, max_iter=10000).fit(X, y)
        assert np.allclose(w, ref.coef_[0], atol=1e-5), C
        assert np.isclose(b, ref.intercept_[0], atol=1e-5), C


def test_steering_accepts_one_target_ratio_per_context():
    rng = np.random.default_rng(13)
    G = rng.standard_normal((16, 4))
    base, target = np.arange(5), np.arange(5, 10)
    w = ds.pair_direction(G, base, target)
    lam0 = rng.standard_normal((4, 4)) - 3 * w / np.linalg.norm(w)
    start = ds.target_ratio(ds.probabilities(G, lam0), base, target)
    goals = np.minimum(start + np.array([0.05, 0.2, 0.4, 0.6]), 0.95)
    res = ds.steer_to_ratio(G, lam0, w, base, target, ratio=goals, step=0.05, max_steps=4000)
    assert res.reached.all()
    reached = ds.target_ratio(ds.probabilities(G, res.lam), base, target)
    assert np.allclose(reached, goals, atol=1e-6)
    assert np.allclose(res.distance, np.linalg.norm(res.lam - lam0, axis=1))
    with pytest.raises(ValueError, match="one per context"):
        ds.steer_to_ratio(G, lam0, w, base, target, ratio=np.full(3, 0.5))
    with pytest.raises(ValueError, match="strictly between"):
        ds.steer_to_ratio(G, lam0, w, base, target, ratio=np.array([0.5, 0.5, 1.2, 0.5]))


def test_stacked_training_matches_one_model_per_seed():
    lang = ds.BilingualLanguage(n_verbs=6, n_topics=2, seed=0)
    single, losses = ds.train_bag_model(lang, d=4, steps=15, batch_size=32, seed=5)
    models, stacked = ds.train_bag_models(lang, [5, 9], d=4, steps=15, batch_size=32)
    assert stacked.shape == (15, 2)
    assert np.allclose(models[0].G, single.G, atol=1e-5)
    assert np.allclose(stacked[:, 0], losses, atol=1e-5)
    with pytest.raises(ValueError):
        ds.train_bag_models(lang, [1, 1], steps=2)


def test_dual_md_pair_r2_and_spread_for_pair_r2():
    G, _ = head(V=10, d=3, seed=7)
    X = np.random.default_rng(0).standard_normal((20, 3))
    y = np.r_[np.zeros(10), np.ones(10)].astype(int)
    mu = ds.mean_parameter(G, X)
    assert np.allclose(ds.dual_mean_difference_probe(G, X, y), mu[10:].mean(0) - mu[:10].mean(0))
    base, target = np.array([0, 1, 2]), np.array([3, 4, 5])
    r2 = ds.pair_r2(G, base, target)
    assert np.isclose(ds.pair_r2(ds.pair_spread_head(G, base, target, 0.0), base, target), 1.0)
    kappa = ds.spread_for_pair_r2(r2, 0.3)
    assert np.isclose(ds.pair_r2(ds.pair_spread_head(G, base, target, kappa), base, target), 0.3)


def test_reciprocal_rank_change_matches_a_direct_computation():
    p0 = np.array([0.5, 0.1, 0.3, 0.1])
    p = np.array([0.1, 0.4, 0.2, 0.3])
    # pair (0, 1) merged: q0 = [0.6, 0.3, 0.1], q = [0.5, 0.2, 0.3]; ranks 1,2,3 -> 1,3,2
    expect = 0.6 * 0 + 0.3 * abs(1 / 3 - 1 / 2) + 0.1 * abs(1 / 2 - 1 / 3)
    assert np.isclose(ds.reciprocal_rank_change(p0, p, [0], [1], top_p=1.0), expect)
    assert ds.reciprocal_rank_change(p0, p0, [0], [1]) == 0


def test_restricted_steering_matches_exact_steering_on_a_small_head():
    G, _ = head(V=12, d=3, seed=8)
    base, target = np.array([0, 1]), np.array([2, 3])
    lam0 = np.random.default_rng(1).standard_normal((3, 3)) * 0.3
    w = ds.pair_direction(G, base, target)
    for alpha in (math.inf, 0.05):
        ref = ds.steer_to_ratio(G, lam0, w, base, target, alpha=alpha, step=0.05,
                                max_steps=400, correct=False)
        res = ds.steer_restricted(G, lam0, w, 2, alpha=alpha, step=0.05, max_steps=400)
        assert np.array_equal(ref.reached, res.reached)
        assert np.allclose(ref.lam, res.lam, atol=2e-3)
    support = ds.top_logit_support(G, lam0, base, target, 3)
    assert list(support[:4]) == [0, 1, 2, 3] and len(set(support)) == len(support)
