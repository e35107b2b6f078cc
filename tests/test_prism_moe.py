"""Tests of icml26.prism_moe: exact decompositions, masks, ridge properties, bad input."""

import numpy as np
import pytest
import torch
from scipy import linalg

import icml26.prism_moe as pm


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    tokens, labels = pm.digit_pyramids(4)
    x = pm.var_inputs(tokens[:64], labels[:64], 4)
    y = torch.tensor(tokens[:64])
    model = pm.VARLite(d_model=16, d_mlp=32, n_heads=2, seed=1)
    pm.train_var(model, x, y, steps=5, batch_size=16)
    return model, x, y


def test_pyramid_matches_pooling():
    tokens, labels = pm.digit_pyramids(4)
    from sklearn.datasets import load_digits
    images = load_digits().images
    assert tokens.shape == (len(labels), 85)
    assert np.array_equal(tokens[:, 21:], pm.quantise(images.reshape(-1, 64), 4))
    assert np.array_equal(tokens[:, 0], pm.quantise(images.mean((1, 2)), 4))
    assert tokens.min() == 0 and tokens.max() == 3


def test_inputs_upsample_the_coarser_scale():
    tokens, labels = pm.digit_pyramids(4)
    x = pm.var_inputs(tokens[:3], labels[:3], 4).numpy()
    assert np.array_equal(x[:, 0], 4 + labels[:3])
    fine_in = x[:, 21:].reshape(3, 8, 8)
    coarse = tokens[:3, 5:21].reshape(3, 4, 4)
    for i in range(8):
        for j in range(8):
            assert np.array_equal(fine_in[:, i, j], coarse[:, i // 2, j // 2])


def test_block_causal_mask_blocks_information_from_finer_scales(tiny):
    model, x, _ = tiny
    changed = x.clone()
    changed[:, 21:] = (changed[:, 21:] + 1) % 4  # change the inputs of the finest block
    with torch.no_grad():
        a, b = model(x), model(changed)
    assert torch.allclose(a[:, :21], b[:, :21], atol=1e-6)
    assert not torch.allclose(a[:, 21:], b[:, 21:])
    mask = pm.block_causal_mask()
    assert mask[4, 1] and mask[1, 4] and not mask[1, 5] and mask[84, 0]


def test_all_experts_active_reproduces_the_dense_ffn(tiny):
    model, x, _ = tiny
    mlp = model.blocks[0].mlp
    h = torch.randn(7, 16)
    perm = np.random.default_rng(0).permutation(32)
    layer = pm.MoEMLP(mlp, perm[:8], perm[8:].reshape(4, 6), top_k=4,
                      router_weight=torch.randn(4, 16))
    with torch.no_grad():
        assert torch.allclose(layer(h), mlp(h), atol=1e-5)


def test_sparse_path_equals_masked_path(tiny):
    model, x, _ = tiny
    mlp = model.blocks[1].mlp
    perm = np.random.default_rng(1).permutation(32)
    layer = pm.MoEMLP(mlp, perm[:8], perm[8:].reshape(4, 6), top_k=2,
                      router_weight=torch.randn(4, 16), router_bias=torch.randn(4))
    h = torch.randn(3, 11, 16)
    with torch.no_grad():
        assert torch.allclose(layer(h), layer.sparse_forward(h), atol=1e-5)
    # brute force: each token's output is the shared part plus its two best experts
    with torch.no_grad():
        logits = layer.router_logits(h)
        experts = layer.expert_outputs(h)
        for b in range(3):
            for t in range(11):
                top = torch.argsort(logits[b, t], descending=True)[:2]
                want = layer.shared_output(h[b, t]) + layer.b2 + experts[b, t, top].sum(0)
                assert torch.allclose(layer(h)[b, t], want, atol=1e-5)


def test_straight_through_gates_give_router_gradients(tiny):
    model, _, _ = tiny
    perm = np.arange(32)
    layer = pm.MoEMLP(model.blocks[0].mlp, perm[:8], perm[8:].reshape(4, 6), top_k=2,
                      router_weight=torch.randn(4, 16))
    layer(torch.randn(5, 16)).pow(2).sum().backward()
    assert layer.router_w.grad is not None and layer.router_w.grad.abs().sum() > 0


def test_ridge_delta_never_increases_error_and_matches_lstsq():
    rng = np.random.default_rng(0)
    for _ in range(30):
        h = rng.normal(size=(200, 6))
        r = rng.normal(size=(200, 3))
        w = rng.normal(size=(3, 6))
        lam_rel, cap = rng.uniform(0, 20), rng.uniform(0, 1)
        w_new, before, after = pm.ridge_delta(h, r, w, lam_rel, cap)
        assert after <= before + 1e-9
        assert np.linalg.norm(w_new - w) <= cap * np.linalg.norm(w) + 1e-9
    # no ridge and no cap: ordinary least squares
    w_new, _, _ = pm.ridge_delta(h, r, w, 0.0, 1e9)
    ols = np.linalg.lstsq(h, r, rcond=None)[0].T
    assert np.allclose(w_new, ols, atol=1e-6)


def test_ridge_router_matches_brute_force_weighted_ridge():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(85, 4))
    t = rng.normal(size=(85, 3))
    w_tok = pm.stage_token_weights()
    lam = 0.3
    rows = pm.ridge_router(x, t, lam=lam, weights=w_tok)
    # reference: augmented weighted least squares, no intercept, then unit rows
    gram = (x * w_tok[:, None]).T @ x
    reg = lam * np.mean(np.diag(gram))
    xa = np.vstack([np.sqrt(w_tok)[:, None] * x, np.sqrt(reg) * np.eye(4)])
    ta = np.vstack([np.sqrt(w_tok)[:, None] * (t - t.mean(1, keepdims=True)), np.zeros((4, 3))])
    sol = linalg.lstsq(xa, ta)[0].T
    assert np.allclose(rows, sol / np.linalg.norm(sol, axis=1, keepdims=True), atol=1e-8)
    assert np.allclose(np.linalg.norm(rows, axis=1), 1.0)
    # every scale carries the same total weight
    offsets = pm.scale_offsets()
    pairs = zip(offsets[:-1], offsets[1:], strict=True)
    assert np.allclose([w_tok[a:b].sum() for a, b in pairs], 1.0)


def test_balance_bias_moves_towards_uniform_and_is_capped():
    logits = np.zeros((60, 4))
    logits[:, 0] = 1.0  # expert 0 always chosen first, experts 1..3 tie for second
    bias = pm.balance_bias(logits, 1, strength=0.25, max_abs=2.0)
    assert abs(bias.sum()) < 1e-12 and bias[0] < 0 and np.all(bias[1:] > 0)
    assert np.all(np.abs(bias) <= 2.0 + 1e-12)
    counts = np.array([60.0, 0, 0, 0])
    eps = 1 / 60
    delta = 0.25 * (np.log(0.25 + eps) - np.log(counts / 60 + eps))
    assert np.allclose(bias, delta - delta.mean())


def test_capacity_kmeans_gives_equal_sizes_and_recovers_clusters():
    rng = np.random.default_rng(3)
    centres = np.eye(4)
    features = np.repeat(centres, 6, axis=0) + 0.05 * rng.normal(size=(24, 4))
    labels = pm.capacity_kmeans(features, rng.uniform(0.5, 1.5, 24), 4)
    assert np.all(np.bincount(labels, minlength=4) == 6)
    for g in range(4):
        assert len(set(labels[g * 6:(g + 1) * 6])) == 1


def test_frechet_distance_closed_form():
    rng = np.random.default_rng(4)
    a = rng.normal(size=(4000, 2))
    b = rng.normal(size=(4000, 2)) * 2 + 1
    # N(0, I) vs N(1, 4I): |mu|^2 = 2, trace = 2 + 8 - 2 * 2 * 2 = 2
    assert abs(pm.frechet_distance(a, b) - 4.0) < 0.4
    assert pm.frechet_distance(a, a) < 1e-8


def test_conversion_fractions_and_compensation(tiny):
    model, x, y = tiny
    gen = pm.generate(model, np.arange(16) % 10, torch.Generator().manual_seed(0))
    traj = pm.var_inputs(gen, np.arange(16) % 10, 4)
    stats = pm.layer_statistics(model, x, y, traj)
    for fraction in (0.375, 0.75):
        for method in pm.METHODS:
            moe, report = pm.convert(model, stats, method, fraction, n_experts=6,
                                     min_tokens=1)
            for layer in pm.moe_layers(moe):
                assert layer.active_neurons() == round(fraction * 32)
            assert all(e["after"] <= e["before"] + 1e-6 for e in report["errors"])
        nocomp, _ = pm.convert(model, stats, "prism_nocomp", fraction, n_experts=6)
        comp, _ = pm.convert(model, stats, "prism", fraction, n_experts=6, min_tokens=1)
        e0 = pm.calibration_error(nocomp, model, stats)
        e1 = pm.calibration_error(comp, model, stats)
        assert np.all(e1 <= e0 * (1 + 1e-5))


def test_blind_stage_one_ignores_the_statistics_and_keeps_the_router(tiny):
    model, x, y = tiny
    gen = pm.generate(model, np.arange(16) % 10, torch.Generator().manual_seed(0))
    stats = pm.layer_statistics(model, x, y, pm.var_inputs(gen, np.arange(16) % 10, 4))
    taylor = stats[0].taylor
    informed, _ = pm.convert(model, stats, "prism_nocomp", 0.75, n_experts=6)
    informed_score = taylor[pm.moe_layers(informed)[0].shared_index.numpy()].mean()
    blind_scores, usage_same = [], []
    for seed in range(40):
        blind, _ = pm.convert(model, stats, "prism_nocomp", 0.75, n_experts=6, seed=seed,
                              blind=True)
        layer = pm.moe_layers(blind)[0]
        blind_scores.append(taylor[layer.shared_index.numpy()].mean())
        covered = np.sort(np.concatenate([layer.shared_index.numpy(),
                                          layer.group_index.numpy().ravel()]))
        usage_same.append(np.array_equal(covered, np.arange(32)))
    # every blind split is still a partition of the neurons ...
    assert all(usage_same)
    # ... whose shared set is a random draw: its mean Taylor score averages the layer's mean,
    # well below the informed choice from the importance pool
    blind_scores = np.array(blind_scores)
    se = blind_scores.std(ddof=1) / np.sqrt(len(blind_scores))
    assert abs(blind_scores.mean() - taylor.mean()) < 4 * se
    assert informed_score > blind_scores.mean() + 4 * se


def _relabelled(pi, idx):
    """The positions j with pi(j) in ``idx``."""
    return set(np.flatnonzero(np.isin(pi, idx)).tolist())


def test_blind_stage_one_is_the_informed_partition_relabelled(tiny):
    """Stage I is permutation-equivariant, so the blind split is the informed one relabelled.

    With ``view = pi`` (neuron j gets neuron pi(j)'s statistics), neuron j lands where pi(j)
    lands in the informed split; for a uniform pi that is a uniformly random equal split, the
    distribution of the random split: the premise of the chapter's falsification control.
    """
    model, x, y = tiny
    gen = pm.generate(model, np.arange(16) % 10, torch.Generator().manual_seed(0))
    stats = pm.layer_statistics(model, x, y, pm.var_inputs(gen, np.arange(16) % 10, 4))
    informed = pm.moe_layers(pm.convert(model, stats, "prism_nocomp", 0.75, n_experts=6)[0])
    for seed in range(5):
        blind = pm.moe_layers(pm.convert(model, stats, "prism_nocomp", 0.75, n_experts=6,
                                         seed=seed, blind=True)[0])
        rng = np.random.default_rng(seed)
        for layer_i, layer_b in zip(informed, blind, strict=True):
            pi = rng.permutation(32)  # the view of this layer, drawn in the order convert draws
            assert (set(layer_b.shared_index.tolist())
                    == _relabelled(pi, layer_i.shared_index.numpy()))
            assert ({frozenset(g.tolist()) for g in layer_b.group_index}
                    == {frozenset(_relabelled(pi, g.numpy())) for g in layer_i.group_index})


def test_random_split_with_the_stage_one_router_fits_the_trajectory_energy(tiny):
    model, x, y = tiny
    gen = pm.generate(model, np.arange(16) % 10, torch.Generator().manual_seed(0))
    stats = pm.layer_statistics(model, x, y, pm.var_inputs(gen, np.arange(16) % 10, 4))
    centroid, _ = pm.convert(model, stats, "random", 0.75, n_experts=6, seed=3)
    ridge, _ = pm.convert(model, stats, "random", 0.75, n_experts=6, seed=3, router="ridge")
    a, b = pm.moe_layers(centroid)[0], pm.moe_layers(ridge)[0]
    # same split (same seed), different router
    assert torch.equal(a.group_index, b.group_index)
    assert not torch.allclose(a.router_w, b.router_w)
    with pytest.raises(ValueError, match="random split only"):
        pm.convert(model, stats, "prism", 0.75, router="ridge")
    with pytest.raises(ValueError, match="Stage I only"):
        pm.convert(model, stats, "random", 0.75, blind=True)
    with pytest.raises(ValueError, match="router must be"):
        pm.convert(model, stats, "random", 0.75, router="cosine")


def test_trajectory_kl_is_zero_for_the_same_model(tiny):
    model, x, _ = tiny
    assert np.allclose(pm.trajectory_kl(model, model, x), 0, atol=1e-6)


def test_bad_input():
    with pytest.raises(ValueError, match="do not divide"):
        pm.check_structure(128, 32, 7, 2)
    with pytest.raises(ValueError, match="larger than the number of experts"):
        pm.check_structure(128, 32, 12, 13)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        pm.structure_for_fraction(128, 1.5)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        pm.structure_for_fraction(128, 0.0)
    with pytest.raises(ValueError, match="not reachable"):
        pm.structure_for_fraction(128, 0.3)
    with pytest.raises(ValueError, match="unknown method"):
        pm.convert(None, [], "bogus", 0.5)
    with pytest.raises(ValueError):
        pm.var_inputs(np.zeros((2, 10), int), np.zeros(2, int), 4)
    assert pm.active_fraction(128, 32, 12, 2) == 0.375
    assert pm.structure_for_fraction(128, 0.75) == (32, 12, 8)


def test_routing_target_ranks_experts_by_remaining_error(tiny):
    model, _, _ = tiny
    perm = np.random.default_rng(5).permutation(32)
    layer = pm.MoEMLP(model.blocks[0].mlp, perm[:8], perm[8:].reshape(6, 4), top_k=2,
                      router_weight=torch.randn(6, 16))
    x = torch.randn(40, 16)
    with torch.no_grad():
        experts = layer.expert_outputs(x)
        target = pm.routing_targets(layer, x, experts)
        g = layer.dense_output(x) - layer.shared_output(x) - layer.b2
        remaining = ((g.unsqueeze(1) - experts) ** 2).sum(-1)
    assert torch.allclose(target.sum(-1), torch.ones(40), atol=1e-5)
    # eq-pm-route: the score is ||g||^2 - ||g - y_e||^2, so the target's order is the
    # reverse order of the remaining squared error, expert by expert
    assert torch.equal(target.argsort(-1), remaining.argsort(-1, descending=True))


def test_flops_count_by_brute_force(tiny):
    model, x, y = tiny
    d, width = 16, 32
    dense_flops = pm.flops_per_token(model)
    assert dense_flops["ffn"] == 2 * 4 * d * width and dense_flops["router"] == 0
    gen = pm.generate(model, np.arange(8) % 10, torch.Generator().manual_seed(1))
    stats = pm.layer_statistics(model, x, y, pm.var_inputs(gen, np.arange(8) % 10, 4))
    moe, _ = pm.convert(model, stats, "random", 0.375, n_experts=6)
    flops = pm.flops_per_token(moe)
    # 8 shared neurons + top-1 of 6 experts of 4 neurons = 12 active neurons per layer
    assert flops["ffn"] == 2 * 4 * d * 12 and flops["router"] == 2 * 2 * d * 6
    assert flops["attention"] == dense_flops["attention"]
    params = pm.active_parameters(moe)
    assert params["ffn_active"] == 2 * (12 * (2 * d + 1) + d + 6 * (d + 1))


def test_convert_rejects_bad_fractions(tiny):
    model, x, y = tiny
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        pm.convert(model, [], "prism", 1.5)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        pm.convert(model, [], "random", 0.0)



def test_teacher_script_round_trip(tmp_path):
    out = tmp_path / "teachers.pt"
    pm.main(["--seeds", "3", "4", "--steps", "2", "--out", str(out)])
    models, seeds, recipe = pm.load_teachers(out)
    assert seeds == [3, 4] and recipe["steps"] == 2 and len(models) == 2
    again = pm.train_teachers([3], **{**pm.TEACHER_RECIPE, "steps": 2})[0]
    for a, b in zip(models[0].parameters(), again.parameters(), strict=True):
        assert torch.allclose(a, b) and not a.requires_grad


def test_load_or_train_teachers_trains_the_missing_models_from_new_seeds(tmp_path):
    out = tmp_path / "teachers.pt"
    pm.main(["--seeds", "3", "1003", "--steps", "2", "--out", str(out)])
    stored, _, _ = pm.load_teachers(out)
    models, seeds, recipe = pm.load_or_train_teachers(4, out)
    assert seeds == [3, 1003, 2003, 3003] and recipe["steps"] == 2 and len(models) == 4
    again = pm.train_teachers([3003], **recipe)[0]
    for a, b in zip(models[3].parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b) and not a.requires_grad
    for a, b in zip(models[0].parameters(), stored[0].parameters(), strict=True):
        assert torch.equal(a, b)
    assert not models[3].training
    fewer, fewer_seeds, _ = pm.load_or_train_teachers(1, out)  # never drops stored models
    assert fewer_seeds == [3, 1003] and len(fewer) == 2


@pytest.mark.parametrize("bad, error", [(0, ValueError), (2.0, TypeError), (True, TypeError)])
def test_load_or_train_teachers_rejects_bad_counts(bad, error):
    with pytest.raises(error, match="n must"):
        pm.load_or_train_teachers(bad)


def test_committed_teachers_follow_the_recipe_and_are_competent():
    from sklearn.linear_model import LogisticRegression

    models, seeds, recipe = pm.load_teachers()
    assert recipe == pm.TEACHER_RECIPE and len(seeds) >= 4
    tokens, labels = pm.digit_pyramids(recipe["levels"])
    train_idx, _ = pm.teacher_split(labels=labels)

    def pixels(p):
        return pm.dequantise(np.asarray(p)[:, 21:], recipe["levels"]) / 16.0

    clf = LogisticRegression(max_iter=2000).fit(pixels(tokens[train_idx]), labels[train_idx])
    wanted = np.arange(200) % 10  # a quick check; the chapter asserts the 85% bar on 500
    scores = [clf.score(pixels(pm.generate(m, wanted, torch.Generator().manual_seed(s + 7))),
                        wanted) for m, s in zip(models, seeds, strict=True)]
    assert sum(score >= 0.82 for score in scores) >= 4


def test_committed_teachers_live_in_data_and_the_cache_key_covers_them(tmp_path, monkeypatch):
    """The teachers are a stored data file (``data/README.md`` lists its checksum), the module
    finds it from a clean checkout, and the chapter's cache key changes with its bytes."""
    import shutil

    from icml26.toolchain import pipeline

    assert pm.TEACHER_FILE == pipeline.DATA_DIR / "prism_moe_teachers.pt"
    assert (pipeline.DATA_DIR / "make_prism_moe_teachers.py").is_file()
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(pm.TEACHER_FILE, data / pm.TEACHER_FILE.name)
    monkeypatch.setattr(pipeline, "DATA_DIR", data)
    chapter = next(c for c in pipeline.chapters() if c.slug == "prism-moe")
    before = pipeline.cache_key(chapter, "smoke", 0)
    stored = data / pm.TEACHER_FILE.name
    stored.write_bytes(stored.read_bytes()[:-1] + b"\x01")
    assert pipeline.cache_key(chapter, "smoke", 0) != before


def test_finetuning_with_cached_teacher_logits_equals_the_teacher_forward(tiny):
    import copy

    model, x, y = tiny
    gen = pm.generate(model, np.arange(16) % 10, torch.Generator().manual_seed(0))
    stats = pm.layer_statistics(model, x, y, pm.var_inputs(gen, np.arange(16) % 10, 4))
    moe, _ = pm.convert(model, stats, "prism", 0.375, n_experts=6, min_tokens=1)
    cached = pm.teacher_logits(model, x, chunk=16)
    assert torch.allclose(cached, model(x), atol=1e-5)
    loss = pm.stage2_loss(model, route_weight=0.1, lb_weight=0.01)
    assert torch.allclose(loss(moe, x[:8], y[:8]), loss(moe, x[:8], y[:8], cached[:8]),
                          atol=1e-5)
    runs = [copy.deepcopy(moe) for _ in range(2)]
    pm.finetune(runs[0], model, x, y, steps=3, batch_size=8, seed=2)
    pm.finetune(runs[1], model, x, y, steps=3, batch_size=8, seed=2, cached=cached)
    for a, b in zip(runs[0].parameters(), runs[1].parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-5)
