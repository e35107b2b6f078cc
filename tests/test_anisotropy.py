"""Tests for the anisotropy chapter: metrics, entropy identities, tangent proxies, training."""

import numpy as np
import pytest
import torch
from scipy.stats import ortho_group
from sklearn.metrics.pairwise import cosine_similarity

from icml26 import anisotropy as an
from icml26 import language
from icml26 import nn as tnn
from icml26.anisotropy import training

RAW_METRICS = {
    "mean_cosine": an.mean_cosine,
    "top1_share": an.top_share,
    "effective_rank": an.effective_rank,
    "partition_isotropy": an.partition_isotropy,
}
CENTRED_METRICS = {
    "top1_share_centred": lambda H: an.top_share(H, 1, centre=True),
    "effective_rank_centred": lambda H: an.effective_rank(H, centre=True),
}


def gaussian(n, d, seed=0):
    return np.random.default_rng(seed).standard_normal((n, d))


def rank_one_plus_noise(n, d, seed=0, noise=0.1):
    """Points 5 u + (a little) noise along one direction u: a narrow cone."""
    rng = np.random.default_rng(seed)
    u = rng.standard_normal(d)
    u /= np.linalg.norm(u)
    return (5 + rng.standard_normal((n, 1))) * u + noise * rng.standard_normal((n, d))


# --- metrics against brute force and exact values --------------------------------------------


def test_mean_cosine_matches_brute_force():
    H = gaussian(200, 7) + 0.5
    S = cosine_similarity(H)
    brute = (S.sum() - np.trace(S)) / (200 * 199)
    assert an.mean_cosine(H) == pytest.approx(brute, abs=1e-12)
    assert an.mean_cosine(torch.tensor(H)) == pytest.approx(brute, abs=1e-12)


def test_spectrum_splits_into_covariance_plus_mean_outer_product():
    H = gaussian(500, 6, seed=1) + np.arange(6)
    moment = H.T @ H / len(H)
    covariance = np.cov(H.T, bias=True)
    mean = H.mean(axis=0)
    assert np.allclose(moment, covariance + np.outer(mean, mean))
    assert np.allclose(an.spectrum(H), np.linalg.eigvalsh(moment)[::-1])
    assert np.allclose(an.spectrum(H, centre=True), np.linalg.eigvalsh(covariance)[::-1])


def test_effective_rank_and_top_share_of_r_equal_directions_are_exact():
    d, r = 10, 4
    Q = ortho_group.rvs(d, random_state=0)
    H = np.zeros((12, d))
    H[:r, :] = 3.0 * Q[:r]  # r orthogonal rows of equal length: r equal singular values
    assert an.effective_rank(H) == pytest.approx(r, rel=1e-12)
    assert an.top_share(H, 1) == pytest.approx(1 / r, rel=1e-12)
    assert an.top_share(H, r) == pytest.approx(1.0, rel=1e-12)


def test_effective_rank_of_a_diagonal_distribution_is_exp_entropy():
    q = np.random.default_rng(2).dirichlet(np.ones(9))
    assert an.effective_rank(np.diag(q)) == pytest.approx(np.exp(an.shannon_entropy(q)))


def test_isotropic_gaussian_scores_isotropic():
    d = 16
    H = gaussian(20_000, d, seed=3)
    assert abs(an.mean_cosine(H)) < 0.005
    assert an.effective_rank(H) > 0.99 * d
    assert an.top_share(H, 1) < 1.1 / d
    assert an.partition_isotropy(H) > 0.9
    assert an.partition_isotropy(H, normalise=False) > 0.5  # unit-variance raw vectors


def test_rank_one_plus_noise_scores_anisotropic():
    H = rank_one_plus_noise(2000, 16)
    assert an.mean_cosine(H) > 0.95
    assert an.top_share(H, 1) > 0.95
    assert an.effective_rank(H) < 4  # singular values, not variances: noise counts
    assert an.partition_isotropy(H) < 0.2
    assert an.top_share(H, 1, centre=True) > 0.8  # the spread is along u too


# --- invariances -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(RAW_METRICS) + list(CENTRED_METRICS))
def test_metrics_are_scale_and_rotation_invariant(name):
    metric = {**RAW_METRICS, **CENTRED_METRICS}[name]
    H = gaussian(300, 8, seed=4) @ np.diag(np.linspace(0.3, 3, 8)) + 0.7
    R = ortho_group.rvs(8, random_state=5)
    reference = metric(H)
    assert metric(3.7 * H) == pytest.approx(reference, rel=1e-9)
    assert metric(H @ R) == pytest.approx(reference, rel=1e-9)


@pytest.mark.parametrize("name", list(RAW_METRICS))
def test_raw_metrics_change_under_a_common_offset(name):
    H = gaussian(300, 8, seed=6)
    shifted = H + 2.0 * np.ones(8) / np.sqrt(8)
    assert abs(RAW_METRICS[name](shifted) - RAW_METRICS[name](H)) > 0.05 * abs(
        RAW_METRICS[name](H)) + 0.01


@pytest.mark.parametrize("name", list(CENTRED_METRICS))
def test_centred_metrics_ignore_a_common_offset(name):
    H = gaussian(300, 8, seed=7)
    metric = CENTRED_METRICS[name]
    assert metric(H + 5.0) == pytest.approx(metric(H), rel=1e-9)


def test_raw_partition_score_depends_on_scale_and_tends_to_one():
    H = rank_one_plus_noise(500, 8)
    small, large = (an.partition_isotropy(s * H, normalise=False) for s in (1e-5, 1.0))
    assert small > 0.999 and large < 1e-3


def test_partition_score_uses_both_signs_of_each_eigenvector():
    H = gaussian(400, 5, seed=8) + np.array([3.0, 0, 0, 0, 0])
    assert an.partition_isotropy(H) == pytest.approx(an.partition_isotropy(-H), rel=1e-12)


# --- entropy and the cone ----------------------------------------------------------------------


def test_collision_probability_bounds_and_sampled_mean_cosine():
    rng = np.random.default_rng(9)
    q = rng.dirichlet(np.full(20, 0.5))
    p2 = an.collision_probability(q)
    pairs = rng.choice(20, size=(200_000, 2), p=q)
    assert (pairs[:, 0] == pairs[:, 1]).mean() == pytest.approx(p2, abs=0.005)
    assert p2 >= np.exp(-an.shannon_entropy(q)) - 1e-12  # H_2 <= H
    types = np.eye(20)  # orthonormal type vectors: distinct tokens have cosine 0
    tokens = rng.choice(20, size=4000, p=q)
    assert an.mean_cosine(types[tokens] + 1e-12) == pytest.approx(p2, abs=0.01)


def test_cone_cosine_is_the_high_dimensional_limit():
    rng = np.random.default_rng(10)
    d = 4000
    mean = np.full(d, 0.02)
    H = mean + 0.03 * rng.standard_normal((300, d))
    predicted = an.cone_cosine(mean, d * 0.03**2)
    assert an.mean_cosine(H) == pytest.approx(predicted, abs=0.01)


def test_curvature_ratio_matches_samples():
    rng = np.random.default_rng(11)
    for spread in (0.1, 0.5):
        X = an.parabola_sample(2.0, spread, 200_000, rng)
        ratio = X[:, 1].var() / X[:, 0].var()
        assert ratio == pytest.approx(an.visible_curvature_ratio(2.0, spread), rel=0.03)


# --- tangent proxies ---------------------------------------------------------------------------


def test_semi_nmf_codes_are_non_negative_and_error_does_not_increase():
    H = gaussian(300, 12, seed=12) + 0.3
    errors = []
    for iterations in (1, 5, 20, 80):
        Z, D = an.semi_nmf(H, 4, iterations=iterations, seed=0)
        assert (Z >= 0).all()
        errors.append(np.linalg.norm(H - Z @ D))
    assert all(b <= a + 1e-9 for a, b in zip(errors, errors[1:], strict=False))
    best = np.sqrt((np.linalg.svd(H, compute_uv=False)[4:] ** 2).sum())  # Eckart-Young
    assert errors[-1] >= best - 1e-9


def test_semi_nmf_recovers_an_exact_factorisation():
    rng = np.random.default_rng(13)
    Z0 = rng.exponential(size=(400, 3)) * (rng.random((400, 3)) < 0.5)
    D0 = rng.standard_normal((3, 10))
    Z, D = an.semi_nmf(Z0 @ D0, 3, iterations=500)
    assert np.linalg.norm(Z0 @ D0 - Z @ D) < 1e-3 * np.linalg.norm(Z0 @ D0)


def test_control_energy_matches_monte_carlo_over_random_complements():
    rng = np.random.default_rng(14)
    d, k = 12, 3
    G = rng.standard_normal((500, d)) @ np.diag(np.linspace(0.2, 2, d))
    Q = an.orthonormal_basis(rng.standard_normal((k, d)))
    draws = [an.energy_share(G, an.random_complement_basis(Q, rng)) for _ in range(4000)]
    se = np.std(draws) / np.sqrt(len(draws))
    assert abs(np.mean(draws) - an.control_energy_share(G, Q)) < 4 * se
    complement = an.orthonormal_basis(np.linalg.svd(np.eye(d) - Q @ Q.T)[0][:, :d - k].T)
    assert an.energy_share(G, Q) + an.energy_share(G, complement) == pytest.approx(1.0)


def test_anisotropy_share_is_one_on_the_best_subspace_and_control_matches_monte_carlo():
    rng = np.random.default_rng(15)
    d, k = 10, 2
    G = rng.standard_normal((800, d)) @ np.diag(np.linspace(0.5, 3, d))
    A = an.gradient_anisotropy(G)
    top = np.linalg.eigh(A)[1][:, -k:]
    assert an.anisotropy_share(G, top)[0] == pytest.approx(1.0)
    Q = an.orthonormal_basis(rng.standard_normal((k, d)))
    draws = []
    for _ in range(3000):
        R = an.random_complement_basis(Q, rng)
        draws.append(np.trace(R.T @ A @ R))
    best = np.clip(np.linalg.eigvalsh(A)[::-1][:k], 0, None).sum()
    se = np.std(draws) / np.sqrt(len(draws)) / best
    assert abs(np.mean(draws) / best - an.anisotropy_share(G, Q)[1]) < 4 * se


def test_anisotropy_share_is_an_affine_function_of_the_energy_share():
    """eq-aniso-share-energy: share(Q) = tr(Sigma) / best * (E(Q) - k/d), for any Q and G."""
    rng = np.random.default_rng(16)
    d, k = 12, 3
    G = rng.standard_normal((400, d)) @ rng.standard_normal((d, d))
    sigma = G.T @ G / len(G)
    best = np.clip(np.linalg.eigvalsh(sigma)[::-1][:k] - np.trace(sigma) / d, 0, None).sum()
    shares, energies = [], []
    for _ in range(20):
        Q = an.orthonormal_basis(rng.standard_normal((k, d)))
        shares.append(an.anisotropy_share(G, Q)[0])
        energies.append(an.energy_share(G, Q))
    predicted = np.trace(sigma) / best * (np.array(energies) - k / d)
    assert np.allclose(shares, predicted, atol=1e-12)
    assert np.all(np.sign(shares) == np.sign(np.array(energies) - k / d))


# --- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize("metric", [*RAW_METRICS.values(), an.all_metrics])
def test_metrics_reject_bad_input(metric):
    with pytest.raises(ValueError, match="at least two"):
        metric(np.ones((1, 4)))
    with pytest.raises(ValueError, match="NaN"):
        metric(np.array([[1.0, np.nan], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="shape"):
        metric(np.ones(5))
    with pytest.raises(TypeError):
        metric([[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(TypeError):
        metric(np.ones((3, 2), dtype=bool))


def test_other_bad_input():
    with pytest.raises(ValueError, match="zero vectors"):
        an.mean_cosine(np.array([[0.0, 0.0], [1.0, 0.0]]))
    with pytest.raises(ValueError, match="k must lie"):
        an.top_share(np.ones((3, 2)) + np.eye(3, 2), k=3)
    G = gaussian(20, 6)
    with pytest.raises(ValueError, match="shape"):
        an.energy_share(G, np.eye(5)[:, :2])  # Q has 5 rows for d = 6
    with pytest.raises(ValueError, match="orthonormal"):
        an.energy_share(G, 2 * np.eye(6)[:, :2])
    with pytest.raises(ValueError, match="sum to 1"):
        an.collision_probability([0.5, 0.6])
    with pytest.raises(ValueError):
        an.parabola_sample(-1.0, 0.1, 10, np.random.default_rng(0))
    with pytest.raises(ValueError, match="fractions"):
        an.entropy_sources([0.5, 1.2])


# --- gradients through the shared tiny GPT (its own tests: tests/test_nn.py) ---------------


def tiny_model(seed=0, context=8):
    config = tnn.GPTConfig(vocab_size=11, context=context, d_model=16, n_layers=2, n_heads=2)
    return tnn.TinyGPT(config, seed=seed).eval()


def test_gradients_match_finite_differences():
    model = tiny_model().double()
    tokens = torch.randint(11, (2, 9), generator=torch.Generator().manual_seed(2))
    x, y = tokens[:, :-1], tokens[:, 1:]
    H, G = an.activations_and_gradients(model, x, y, layer=1)
    assert np.allclose(H, an.layer_states(model, x)[1])

    def loss_with(offset):
        def add(activation):
            return activation + offset
        with torch.no_grad(), tnn.hooks(model, {"blocks.0.hook_resid_post": add}):
            logits = model(x)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(),
                                                 reduction="sum").item()

    eps = 1e-6
    for position, coordinate in [(0, 3), (5, 0), (12, 15)]:
        offset = torch.zeros(2, 8, 16, dtype=torch.float64)
        offset.view(-1, 16)[position, coordinate] = eps
        numeric = (loss_with(offset) - loss_with(-offset)) / (2 * eps)
        assert numeric == pytest.approx(G[position, coordinate], rel=1e-5, abs=1e-8)


def test_entropy_sources_hit_their_entropy_rates():
    for seed in (0, 3):  # seed 3 has chains too slow to mix at temperature 0.1
        sources = an.entropy_sources([0.2, 0.5, 0.8], vocab_size=64, seed=seed)
        rates = [s.entropy_rate / np.log(64) for s in sources]
        assert np.allclose(rates, [0.2, 0.5, 0.8], atol=1e-4)
    with pytest.raises(ValueError, match="outside the reachable range"):
        an.entropy_sources([0.01], vocab_size=64, seed=0)


def test_checkpoints_are_saved_and_measured(tmp_path):
    source = an.entropy_sources([0.5], vocab_size=64, seed=0)[0]
    corpus = language.make_corpus(source, 2000, 400, length=20, seed=0)
    config = tnn.GPTConfig(vocab_size=64, context=8, d_model=16, n_layers=2, n_heads=2)
    model = tnn.TinyGPT(config, seed=0)
    paths = an.train_with_checkpoints(model, corpus.train, tmp_path, steps=6,
                                      checkpoint_steps=[2, 6], batch_size=4)
    assert sorted(paths) == [0, 2, 6]
    x, y = an.evaluation_batch(corpus.test, 8)
    records = an.measure_checkpoint(paths[6], x, y, tangent_layers=[2], k=3)
    assert [r["layer_name"] for r in records] == ["embed", "block 1", "block 2"]
    assert records[-1]["step"] == 6 and "ratio" in records[-1] and "ratio" not in records[0]
    reloaded, _ = tnn.load_checkpoint(paths[6])
    assert an.mean_cosine(an.layer_states(reloaded, x)[2]) == pytest.approx(
        records[2]["mean_cosine"])
    with pytest.raises(ValueError, match="checkpoint steps"):
        an.train_with_checkpoints(model, corpus.train, tmp_path, steps=6, checkpoint_steps=[7])
    with pytest.raises(ValueError, match="tangent layers"):
        an.measure_checkpoint(paths[6], x, y, tangent_layers=[5])


def test_masked_tokens_and_encoder_loss():
    x = torch.randint(10, (50, 33), generator=torch.Generator().manual_seed(3))
    inputs, targets = training.mask_tokens(x, 10, 0.15, torch.Generator().manual_seed(0))
    masked = targets != -100
    assert 0.12 < masked.float().mean() < 0.18 and masked.any(dim=1).all()
    assert (inputs[masked] == 10).all() and torch.equal(inputs[~masked], x[~masked])
    assert torch.equal(targets[masked], x[masked])
    config = tnn.GPTConfig(vocab_size=11, context=32, d_model=16, n_layers=1, n_heads=2,
                           causal=False)
    model = tnn.TinyGPT(config, seed=0)
    loss = training.masked_token_loss(10, 0.15, seed=0)
    result = tnn.train(model, x, steps=40, batch_size=8, lr=1e-2, loss=loss)
    assert np.mean(result.losses[-5:]) < np.mean(result.losses[:5])
    with pytest.raises(ValueError, match="mask rate"):
        training.mask_tokens(x, 10, 1.5, torch.Generator())


def test_train_stacked_matches_training_each_model_alone(tmp_path):
    config = tnn.GPTConfig(vocab_size=12, context=8, d_model=8, n_layers=1, n_heads=2)
    rng = np.random.default_rng(0)
    corpora = [rng.integers(0, 12, size=(16, 12)) for _ in range(2)]
    alone = [tnn.TinyGPT(config, seed=s) for s in (0, 1)]
    for model, corpus, seed in zip(alone, corpora, (5, 6), strict=True):
        tnn.train(model, corpus, steps=6, batch_size=4, lr=1e-2, seed=seed)
    for vectorise in (True, False):
        stacked = [tnn.TinyGPT(config, seed=s) for s in (0, 1)]
        paths = training.train_stacked(stacked, corpora, steps=6, seeds=(5, 6), batch_size=4,
                                       lr=1e-2, checkpoints=[(tmp_path / "a", (3, 6)), None],
                                       vectorise=vectorise)
        for a, b in zip(alone, stacked, strict=True):
            for p, q in zip(a.parameters(), b.parameters(), strict=True):
                assert torch.allclose(p, q, atol=1e-5)
    assert sorted(paths[0]) == [0, 3, 6] and paths[1] == {}
    saved, info = tnn.load_checkpoint(paths[0][6])
    assert info["step"] == 6 and torch.allclose(saved.lm_head.weight, stacked[0].lm_head.weight)
    with pytest.raises(ValueError, match="same length"):
        training.train_stacked(stacked, corpora[:1], steps=2, seeds=(0, 1))


def test_rank_correlation_test_matches_scipy_permutation_test():
    from scipy.stats import permutation_test, spearmanr

    rng = np.random.default_rng(3)
    for _ in range(5):
        x, y = rng.standard_normal(5), rng.standard_normal(5)
        rho, p = an.rank_correlation_test(x, y)
        reference = permutation_test((y,), lambda yy, x=x: spearmanr(x, yy).statistic,
                                     permutation_type="pairings", alternative="greater")
        assert rho == pytest.approx(spearmanr(x, y).statistic)
        assert p == pytest.approx(reference.pvalue)
    assert an.rank_correlation_test(np.arange(5), np.arange(5) ** 2) == pytest.approx((1, 1 / 120))
    with pytest.raises(ValueError):
        an.rank_correlation_test([1, 2], [1, 2])
    with pytest.raises(ValueError):
        an.rank_correlation_test([1, 2, 3], [1, 1, 1])


def test_circle_source_is_a_reversible_walk_with_von_mises_stationary_law():
    source = an.circle_source(32, concentration=2.0, max_step=2)
    P, pi = source.transition, source.stationary
    assert np.allclose(P.sum(axis=1), 1) and (P >= 0).all()
    assert np.allclose(pi @ P, pi)  # stationary
    assert np.allclose(pi[:, None] * P, (pi[:, None] * P).T)  # detailed balance
    theta = 2 * np.pi * np.arange(32) / 32
    assert np.allclose(pi, np.exp(2 * np.cos(theta)) / np.exp(2 * np.cos(theta)).sum())
    steps = (np.arange(32)[None, :] - np.arange(32)[:, None]) % 32
    assert P[(steps > 2) & (steps < 30)].max() == 0  # only local moves
    with pytest.raises(ValueError):
        an.circle_source(8, max_step=4)
    with pytest.raises(ValueError):
        an.circle_source(8, concentration=-1.0)


def test_circle_tangent_is_the_derivative_of_the_frozen_embedding():
    plane = an.circle_plane(10, seed=1)
    model = an.circle_model(tnn.GPTConfig(vocab_size=16, context=4, d_model=10, n_layers=1,
                                          n_heads=2), plane, radius=2.0)
    table = model.tok_emb.weight.detach().double().numpy()
    assert not model.tok_emb.weight.requires_grad
    tangent, normal = an.tangent_and_normal(np.arange(16), 16, plane)
    step = 2 * np.pi / 16
    finite = (np.roll(table, -1, axis=0) - np.roll(table, 1, axis=0)) / (2 * step) / 2.0
    assert np.allclose(finite / np.linalg.norm(finite, axis=1, keepdims=True), tangent,
                       atol=1e-12)
    assert np.allclose(normal, table / 2.0, atol=1e-6)
    assert np.allclose((tangent * normal).sum(axis=1), 0)


def test_direction_share_and_subspace_capture():
    rng = np.random.default_rng(0)
    G = rng.standard_normal((4000, 12))
    directions = rng.standard_normal((4000, 12))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    assert an.direction_share(G, directions) == pytest.approx(1 / 12, rel=0.1)
    assert an.direction_share(G, G / np.linalg.norm(G, axis=1, keepdims=True)) == pytest.approx(1)
    Q = np.linalg.qr(rng.standard_normal((12, 3)))[0]
    assert an.subspace_capture(Q, directions) == pytest.approx(3 / 12, rel=0.1)
    assert an.subspace_capture(Q, Q.T) == pytest.approx(1)
    with pytest.raises(ValueError):
        an.direction_share(G, 2 * directions)


def test_shuffled_source_keeps_entropy_and_breaks_circle_neighbours():
    geometric = an.circle_source(16, 2.0, max_step=1)
    shuffled = an.shuffled_source(geometric, seed=3)
    assert shuffled.entropy_rate == pytest.approx(geometric.entropy_rate, abs=1e-12)
    assert np.allclose(shuffled.stationary @ shuffled.transition, shuffled.stationary)
    assert np.allclose(np.sort(shuffled.stationary), np.sort(geometric.stationary))
    steps = [(w - v) % 16 for v in range(16) for w in range(16)
             if w != v and shuffled.transition[v, w] > 0]
    assert any(step not in (1, 15) for step in steps)  # some moves jump across the circle
    with pytest.raises(ValueError):
        an.shuffled_source(language.zipf_markov_source(4, 2, seed=0))


def test_stratified_rank_test():
    x = np.tile(np.arange(5.0), 3)
    strata = np.repeat([0, 1, 2], 5)
    rho, p = an.stratified_rank_test(x, x + 10 * strata, strata, permutations=2000, seed=0)
    assert rho == pytest.approx(1.0) and p < 0.01  # perfect order in every stratum
    rho, p = an.stratified_rank_test(x, -x, strata, permutations=2000, seed=0)
    assert rho == pytest.approx(-1.0) and p > 0.99
    # one stratum: the Monte Carlo p-value approaches the exact one
    _, exact = an.rank_correlation_test(np.arange(5.0), np.array([0.0, 2, 1, 3, 4]))
    _, approx = an.stratified_rank_test(np.arange(5.0), np.array([0.0, 2, 1, 3, 4]),
                                        np.zeros(5), permutations=20_000, seed=1)
    assert approx == pytest.approx(exact, abs=0.01)
    with pytest.raises(ValueError):
        an.stratified_rank_test(x[:2], x[:2], strata[:2])


def test_cross_fitted_shares_never_score_on_fitting_rows():
    from icml26.anisotropy import smollm

    rng = np.random.default_rng(0)
    basis = np.linalg.qr(rng.standard_normal((12, 2)))[0]
    H = np.abs(rng.standard_normal((80, 2))) @ basis.T + 0.01 * rng.standard_normal((80, 12))
    G = rng.standard_normal((80, 2)) @ basis.T  # gradients live in the span of the activations
    block = np.repeat(np.arange(8), 10)
    shares = smollm.cross_fitted_shares(H, G, block, np.eye(12)[:, :2], 2, n_folds=4)
    assert set(shares) == {"proxy", "head", "k_over_d"} and len(shares["proxy"]) == 4
    assert shares["proxy"].min() > 0.95 and np.allclose(shares["k_over_d"], 2 / 12)
    with pytest.raises(ValueError):
        smollm.cross_fitted_shares(H, G, np.zeros(80), np.eye(12)[:, :2], 2, n_folds=4)


def test_permutation_chance_share_is_the_mean_over_all_permutations():
    import itertools

    rng = np.random.default_rng(0)
    d, k = 6, 2
    G = rng.standard_normal((40, d)) + 0.7  # a common offset, so the ones direction matters
    Q = an.orthonormal_basis(rng.standard_normal((k, d)) + 0.5)
    exact = np.mean([an.energy_share(G, Q[list(p)]) for p in itertools.permutations(range(d))])
    assert an.permutation_chance_share(G, Q) == pytest.approx(exact, abs=1e-12)
    # Gradients orthogonal to the ones vector (as behind a LayerNorm): the level lies within
    # k / (d (d - 1)) of k / d, below or above depending on Q's overlap with the ones vector.
    G_perp = G - G.mean(axis=1, keepdims=True)
    share = an.permutation_chance_share(G_perp, Q)
    assert k / d - (d - k) / (d * (d - 1)) - 1e-12 <= share <= k / d + k / (d * (d - 1)) + 1e-12
    with pytest.raises(ValueError):
        an.permutation_chance_share(G, np.ones((d, k)))


def test_training_is_equivariant_under_permuting_the_residual_coordinates():
    # The premise of eq-aniso-permutation: relabelling the residual-stream coordinates of the
    # initial weights relabels every later activation and gradient the same way (the
    # initialisation law is invariant under it, so the law of G is too). A fixed positional
    # code, a structured initialisation or a non-elementwise optimiser would break this.
    config = tnn.GPTConfig(vocab_size=12, context=8, d_model=8, n_layers=2, n_heads=2)
    perm = torch.from_numpy(np.random.default_rng(1).permutation(config.d_model))
    rows = ("attn.proj.weight", "mlp.fc_out.weight")  # write into the residual stream
    columns = ("tok_emb.weight", "pos_emb.weight", "attn.qkv.weight", "mlp.fc_in.weight",
               "lm_head.weight")  # read from it
    vectors = ("ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias", "ln_f.weight", "ln_f.bias",
               "attn.proj.bias", "mlp.fc_out.bias")
    model, relabelled = tnn.TinyGPT(config, seed=3), tnn.TinyGPT(config, seed=3)
    with torch.no_grad():
        for name, p in relabelled.named_parameters():
            if name.endswith(rows):
                p.copy_(p[perm])
            elif name.endswith(columns):
                p.copy_(p[:, perm])
            elif name.endswith(vectors):
                p.copy_(p[perm])
            else:
                assert name.endswith(("qkv.bias", "fc_in.bias")), name  # not in the residual
    corpus = np.random.default_rng(0).integers(0, 12, size=(16, 12))
    for m in (model, relabelled):
        training.train_stacked([m], [corpus], steps=5, seeds=[7], batch_size=4, lr=1e-2)
    x, y = an.evaluation_batch(corpus[:4], config.context)
    for layer in range(config.n_layers + 1):
        H, G = an.activations_and_gradients(model, x, y, layer)
        H_p, G_p = an.activations_and_gradients(relabelled, x, y, layer)
        assert np.allclose(H_p, H[:, perm], atol=1e-4) and np.allclose(G_p, G[:, perm], atol=1e-4)
    assert not np.allclose(G_p, G, atol=1e-3)  # the relabelling did move the coordinates
