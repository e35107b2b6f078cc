"""Tests for icml26.rita: Sinkhorn against POT, the attack, the views, the methods, bad input."""

import math
import re

import numpy as np
import ot
import pytest
import scipy.linalg
import torch

from icml26 import rita
from icml26.claims import load_stored_run, stored_row


@pytest.fixture(scope="module")
def small_model():
    torch.manual_seed(0)
    emb = torch.nn.functional.normalize(torch.randn(10, 4, 24), dim=-1)  # no MiniLM needed
    xtr, ytr, xte, yte = rita.load_digit_split(300, 40, 0)
    model = rita.train_mini_clip(xtr, ytr, epochs=3, seed=0, text_embeddings=emb, dim=16)
    return model, xte, yte


def test_sinkhorn_matches_pot_plan_and_objective():
    rng = np.random.default_rng(0)
    for n, m, reg in [(7, 5, 0.1), (12, 3, 0.05), (4, 9, 0.5)]:
        cost = rng.uniform(0, 2, (n, m))
        a = rng.dirichlet(np.ones(n))
        b = rng.dirichlet(np.ones(m))
        ref = ot.sinkhorn(a, b, cost, reg, method="sinkhorn_log", numItermax=20000,
                          stopThr=1e-14)
        ours = rita.sinkhorn(torch.tensor(cost), torch.tensor(a), torch.tensor(b), reg, 3000)
        assert np.abs(ours.numpy() - ref).max() < 1e-6
        # marginals
        assert np.allclose(ours.sum(1).numpy(), a, atol=1e-8)
        assert np.allclose(ours.sum(0).numpy(), b, atol=1e-8)
        # the entropic objective <T,C> - reg h(T) computed from POT's plan
        pot_obj = float((ref * cost).sum() + reg * (ref * np.log(ref)).sum())
        ours_obj = float(rita.entropic_objective(ours, torch.tensor(cost), reg))
        assert abs(pot_obj - ours_obj) < 1e-6
        # POT's sinkhorn2 is the transport part <T, C>
        assert abs(float((ours * torch.tensor(cost)).sum())
                   - float(ot.sinkhorn2(a, b, cost, reg, method="sinkhorn_log",
                                        numItermax=20000, stopThr=1e-14))) < 1e-6


def test_batched_sinkhorn_equals_one_by_one_and_zero_mass_padding():
    gen = torch.Generator().manual_seed(1)
    cost = torch.rand(3, 5, 6, 4, generator=gen, dtype=torch.float64)
    a = torch.full((3, 5, 6), 1 / 6, dtype=torch.float64)
    b = torch.full((3, 5, 4), 1 / 4, dtype=torch.float64)
    batched = rita.sinkhorn(cost, a, b, 0.1, 200)
    one = rita.sinkhorn(cost[2, 3], a[2, 3], b[2, 3], 0.1, 200)
    assert torch.allclose(batched[2, 3], one)
    # a padded target with zero mass gives the same objective as the unpadded problem
    pad_cost = torch.cat([cost[0, 0], torch.rand(6, 2, generator=gen, dtype=torch.float64)], 1)
    pad_b = torch.cat([b[0, 0], torch.zeros(2, dtype=torch.float64)])
    padded = rita.sinkhorn(pad_cost, a[0, 0], pad_b, 0.1, 200)
    assert float(padded[:, 4:].abs().max()) == 0.0
    assert torch.allclose(rita.entropic_objective(padded, pad_cost, 0.1),
                          rita.entropic_objective(batched[0, 0], cost[0, 0], 0.1))


def test_ot_distance_small_reg_approaches_exact_emd():
    rng = np.random.default_rng(2)
    z = torch.nn.functional.normalize(torch.tensor(rng.normal(size=(1, 6, 5))), dim=-1)
    t = torch.nn.functional.normalize(torch.tensor(rng.normal(size=(1, 2, 3, 5))), dim=-1)
    d = rita.ot_distances(z, t, reg=1e-3, n_iter=5000)
    for k in range(2):
        cost = (1 - z[0] @ t[0, k].T).numpy()
        exact = ot.emd2(np.full(6, 1 / 6), np.full(3, 1 / 3), cost)
        assert abs(float(d[0, k]) - exact) < 5e-3  # entropic bias is O(reg log n)


def test_pgd_stays_in_ball_raises_loss_and_one_step_is_fgsm(small_model):
    model, x, y = small_model
    eps = 0.1
    adv = rita.pgd(model, x, y, eps, steps=7)
    assert float((adv - x).abs().max()) <= eps + 1e-6
    assert float(adv.min()) >= 0 and float(adv.max()) <= 1
    ce = torch.nn.functional.cross_entropy
    with torch.no_grad():
        assert float(ce(model(adv), y)) > float(ce(model(x), y))
    one = rita.pgd(model, x, y, eps, steps=1, alpha=eps)
    assert torch.equal(one, rita.fgsm(model, x, y, eps))
    assert torch.equal(rita.pgd(model, x, y, 0.0), x)


def test_pgd_random_start_lies_in_the_ball_and_is_deterministic(small_model):
    model, x, y = small_model
    eps = 0.1
    # a flat loss has a zero gradient, so the ascent returns its (projected) start
    start = rita._ascend(x, lambda z: (0 * z).sum(), eps, 1, eps, random_start=True,
                         generator=torch.Generator().manual_seed(3))
    assert float((start - x).abs().max()) <= eps + 1e-6
    assert float(start.min()) >= 0 and float(start.max()) <= 1
    assert not torch.equal(start, x)
    inside = (x > eps) & (x < 1 - eps)  # no clipping: the start is spread over the ball
    assert float((start - x)[inside].abs().mean()) == pytest.approx(eps / 2, rel=0.2)

    def attack(seed):
        return rita.pgd(model, x, y, eps, steps=7, random_start=True,
                        generator=torch.Generator().manual_seed(seed))

    adv = attack(0)
    assert torch.equal(adv, attack(0))
    assert not torch.equal(adv, attack(1))
    assert float((adv - x).abs().max()) <= eps + 1e-6
    assert float(adv.min()) >= 0 and float(adv.max()) <= 1
    ce = torch.nn.functional.cross_entropy
    with torch.no_grad():
        assert float(ce(model(adv), y)) > float(ce(model(x), y))
    assert torch.equal(rita.pgd(model, x, y, eps, random_start=False), rita.pgd(model, x, y, eps))
    with pytest.raises(TypeError):
        rita.pgd(model, x, y, eps, random_start=True, generator=0)


def test_views_shape_range_and_first_view(small_model):
    _, x, _ = small_model
    v = rita.make_views(x[:5], 9, generator=torch.Generator().manual_seed(0))
    assert v.shape == (5, 9, 1, 8, 8)
    assert torch.equal(v[:, 0], x[:5])
    assert float(v.min()) >= 0 and float(v.max()) <= 1
    # with no rotation, noise or erasing, every view is an integer shift of the image
    plain = rita.make_views(x[:3], 6, generator=torch.Generator().manual_seed(1), max_degrees=0.0,
                         noise=0.0, erase_prob=0.0)
    for i in range(3):
        for j in range(1, 6):
            ok = False
            for dy in (-1, 0, 1):
                for dx in (-1, 0, 1):
                    shifted = torch.nn.functional.pad(x[i, 0], (1, 1, 1, 1))
                    shifted = shifted[1 - dy:9 - dy, 1 - dx:9 - dx]
                    ok |= bool(torch.allclose(plain[i, j, 0], shifted, atol=1e-5))
            assert ok


def test_batched_adaptation_equals_per_image(small_model):
    model, x, _ = small_model
    gen = torch.Generator().manual_seed(3)
    vb = rita.encode_views(model, rita.make_views(x[:6], 8, generator=gen))
    for method in (rita.tpt, rita.rtpt, rita.rita_distances):
        batched = method(model, vb)
        for i in (0, 4):
            single = method(model, rita.ViewBatch(vb.features[i:i + 1]))
            assert torch.allclose(batched[i], single[0], atol=1e-5)


def test_prompt_step_changes_prediction_scores_and_resets(small_model):
    model, x, _ = small_model
    gen = torch.Generator().manual_seed(4)
    vb = rita.encode_views(model, rita.make_views(x[:8], 8, generator=gen))
    before = model.context.clone()
    d0 = rita.rita_distances(model, vb, steps=0)
    d1 = rita.rita_distances(model, vb, steps=1)
    assert torch.equal(model.context, before)  # the shared prompt is never modified
    assert not torch.allclose(d0, d1)
    # the step lowers the objective it descends (min_k d_k) on average
    assert float(d1.min(-1).values.mean()) < float(d0.min(-1).values.mean())


def test_reliability_weights_match_a_loop():
    gen = torch.Generator().manual_seed(5)
    z = torch.nn.functional.normalize(torch.randn(2, 7, 4, generator=gen), dim=-1)
    w = rita.reliability_weights(z, 3, 0.1)
    for b in range(2):
        scores = []
        for n in range(7):
            sims = sorted((float(z[b, n] @ z[b, j]) for j in range(7) if j != n), reverse=True)
            scores.append(np.mean(sims[:3]))
        ref = np.exp(np.array(scores) / 0.1)
        assert np.allclose(w[b].numpy(), ref / ref.sum(), atol=1e-6)


def test_minimal_rotation_solves_procrustes():
    rng = np.random.default_rng(6)
    for _ in range(5):
        x = rng.normal(size=(5, 6))
        zbar = rng.normal(size=6)
        target = np.ones((5, 1)) * zbar[None, :]
        w = rita.minimal_rotation(torch.tensor(x.sum(0)), torch.tensor(zbar)).numpy()
        assert np.allclose(w.T @ w, np.eye(6), atol=1e-10)
        ref, _ = scipy.linalg.orthogonal_procrustes(x, target)
        ours = np.linalg.norm(x @ w - target)
        best = np.linalg.norm(x @ ref - target)
        assert abs(ours - best) < 1e-8
        # it fixes the complement of span(source, target)
        basis = np.linalg.qr(np.stack([x.sum(0), zbar], 1), mode="complete")[0][:, 2:]
        assert np.allclose(basis.T @ w, basis.T, atol=1e-10)


def test_cache_uses_only_past_images_and_no_labels(small_model):
    model, x, _ = small_model
    gen = torch.Generator().manual_seed(7)
    vb = rita.encode_views(model, rita.make_views(x[:12], 8, generator=gen))
    base = rita.rita_distances(model, vb, steps=0)
    scores, info = rita.run_cache(model, vb, base, gamma=10.0, alpha=1.0)
    # the first image sees an empty cache: its scores are the base distances
    assert torch.allclose(scores[0], base[0])
    # a prefix of the stream gives the same scores: no look-ahead
    prefix, _ = rita.run_cache(model, rita.ViewBatch(vb.features[:5]), base[:5], gamma=10.0)
    assert torch.allclose(prefix, scores[:5])
    assert info["entries"][-1] <= 10 * 6
    off, _ = rita.run_cache(model, vb, base, alpha=0.0)
    assert torch.allclose(off, base)


@pytest.mark.parametrize("eps", [-0.1, math.inf, math.nan])
def test_bad_epsilon(small_model, eps):
    model, x, y = small_model
    with pytest.raises(ValueError):
        rita.pgd(model, x, y, eps)
    with pytest.raises(TypeError):
        rita.check_epsilon("0.1")


def test_bad_images_and_zero_views(small_model):
    model, x, y = small_model
    with pytest.raises(ValueError):
        rita.pgd(model, x[:, :, :4], y, 0.1)  # wrong shape
    with pytest.raises(ValueError):
        rita.make_views(x * 16, 4)  # wrong range
    with pytest.raises(TypeError):
        rita.make_views(x.numpy(), 4)
    with pytest.raises(ValueError):
        rita.make_views(x, 0)
    with pytest.raises(ValueError):
        rita.ot_distances(torch.zeros(2, 0, 16), model.text_features())
    with pytest.raises(ValueError):
        rita.encode_views(model, torch.zeros(2, 0, 1, 8, 8))


def test_stored_prompt_embeddings_equal_a_fresh_minilm_embedding():
    assert rita.PROMPTS_FILE.exists()
    stored = np.load(rita.PROMPTS_FILE)
    fresh = rita.embed_prompts_with_minilm()
    assert stored.shape == (10, 4, 384)
    assert np.abs(stored - fresh).max() < 1e-5
    assert np.allclose(np.linalg.norm(stored, axis=-1), 1, atol=1e-5)
    assert torch.equal(rita.embed_prompts(), torch.tensor(stored))


def test_hand_written_adam_and_adamw_step_match_torch_optim():
    gen = torch.Generator().manual_seed(8)
    p0 = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    grads = [torch.randn(5, 3, generator=gen, dtype=torch.float64) for _ in range(6)]
    ours, ref = p0.clone(), p0.clone().requires_grad_(True)
    mine = rita.Adam([ours], lr=3e-3)
    opt = torch.optim.Adam([ref], lr=3e-3)
    for g in grads:
        mine.step([g])
        ref.grad = g.clone()
        opt.step()
    assert torch.allclose(ours, ref.detach(), atol=1e-12)
    ref = p0.clone().requires_grad_(True)
    opt = torch.optim.AdamW([ref], lr=5e-3)
    ref.grad = grads[0].clone()
    opt.step()
    assert torch.allclose(rita.adamw_first_step(p0, grads[0], 5e-3), ref.detach(), atol=1e-12)


def test_eot_pgd_stays_in_ball_and_raises_the_view_averaged_loss(small_model):
    model, x, y = small_model
    eps = 0.1
    adv = rita.eot_pgd(model, x, y, eps, n_views=6, steps=5, seed=1)
    assert float((adv - x).abs().max()) <= eps + 1e-6
    assert float(adv.min()) >= 0 and float(adv.max()) <= 1

    def view_loss(images):  # fresh views, not the attacker's
        views = rita.make_views(images, 24, generator=torch.Generator().manual_seed(9))
        with torch.no_grad():
            probs = model(views.reshape(-1, 1, 8, 8)).softmax(-1).reshape(len(y), 24, -1)
        return float(-torch.log(probs.mean(1).gather(1, y[:, None]).clamp_min(1e-12)).mean())

    assert view_loss(adv) > view_loss(x)
    # against the view-averaged loss it beats PGD on the image alone at the same budget
    assert view_loss(adv) > view_loss(rita.pgd(model, x, y, eps, steps=5))
    with pytest.raises(ValueError):
        rita.eot_pgd(model, x, y, eps, n_views=1)
    with pytest.raises(ValueError):
        rita.eot_pgd(model, x, y, -eps)


def test_cross_fit_splits_cover_every_item_once():
    splits = rita.cross_fit_splits(101, 3, folds=2, n_val=10)
    tests = torch.cat([te for _, _, te in splits])
    assert sorted(tests.tolist()) == list(range(101))
    for train, val, test in splits:
        assert len(val) == 10
        parts = [set(train.tolist()), set(val.tolist()), set(test.tolist())]
        assert not (parts[0] & parts[1] or parts[0] & parts[2] or parts[1] & parts[2])
        assert len(train) + len(val) + len(test) == 101
    assert torch.equal(splits[0][2], rita.cross_fit_splits(101, 3, folds=2, n_val=10)[0][2])
    with pytest.raises(ValueError):
        rita.cross_fit_splits(10, 0, n_val=5)
    with pytest.raises(ValueError):
        rita.cross_fit_splits(10, 0, n_val=-1)


def test_rtpt_reuses_tuned_logits_and_large_temperature_is_uniform(small_model):
    model, x, _ = small_model
    vb = rita.encode_views(model, rita.make_views(x[:6], 8,
                                                  generator=torch.Generator().manual_seed(2)))
    tuned = rita.rtpt_view_logits(model, vb)
    assert torch.allclose(rita.rtpt(model, vb), rita.rtpt(model, vb, tuned=tuned))
    w = rita.reliability_weights(vb.features, 3, 1e6)
    assert torch.allclose(w, torch.full_like(w, 1 / 8), atol=1e-5)
    # rita_distances is the OT reading at the tuned context
    ctx = rita.tuned_context(model, vb)
    d = rita.ot_distances(vb.features, model.text_features(ctx))
    assert torch.allclose(d, rita.rita_distances(model, vb), atol=1e-6)


def test_ot_pgd_stays_in_ball_and_raises_the_ot_margin(small_model):
    model, x, y = small_model
    eps = 0.1

    def margin(images):
        vb = rita.encode_views(model, rita.make_views(images, 16,
                                                      generator=torch.Generator().manual_seed(9)))
        return float(rita.ot_margin(rita.rita_distances(model, vb, n_iter=30), y).mean())

    for through in (True, False):
        adv = rita.ot_pgd(model, x, y, eps, n_views=4, steps=6, seed=1, through_step=through,
                          n_iter=20)
        assert float((adv - x).abs().max()) <= eps + 1e-6
        assert float(adv.min()) >= 0 and float(adv.max()) <= 1
        assert margin(adv) > margin(x)
    assert torch.equal(rita.ot_pgd(model, x, y, 0.0, steps=2, n_views=2), x)
    with pytest.raises(ValueError):
        rita.ot_pgd(model, x, y, eps, n_views=1)
    with pytest.raises(ValueError):
        rita.ot_pgd(model, x, y[:3], eps)


def test_ot_margin_sign():
    d = torch.tensor([[0.1, 0.3, 0.2], [0.5, 0.2, 0.4]])
    y = torch.tensor([0, 0])
    assert torch.allclose(rita.ot_margin(d, y), torch.tensor([-0.1, 0.3]))


def test_kernel_and_log_domain_sinkhorn_agree_in_plan_and_gradient():
    gen = torch.Generator().manual_seed(3)
    base = 2 * torch.rand(4, 3, 9, 5, generator=gen, dtype=torch.float64)
    a = torch.softmax(torch.randn(4, 3, 9, generator=gen, dtype=torch.float64), -1)
    b = torch.full((4, 3, 5), 0.2, dtype=torch.float64)
    plans, grads = [], []
    for log_domain in (True, False):
        cost = base.clone().requires_grad_(True)
        plan = rita.sinkhorn(cost, a, b, 0.05, 40, log_domain=log_domain)
        (grad,) = torch.autograd.grad(rita.entropic_objective(plan, cost, 0.05).sum(), cost)
        plans.append(plan.detach())
        grads.append(grad)
    assert torch.allclose(plans[0], plans[1], rtol=1e-9, atol=1e-12)
    assert torch.allclose(grads[0], grads[1], rtol=1e-7, atol=1e-9)
    # the default picks the kernel domain for a spread of 2 / 0.05 = 40 <= KERNEL_SPREAD ...
    assert torch.equal(rita.sinkhorn(base, a, b, 0.05, 40), plans[1])
    # ... and the log domain where exp(-C / reg) would underflow: the plan stays exact
    tiny = rita.sinkhorn(base, a, b, 1e-3, 400)
    assert torch.isfinite(tiny).all()
    assert torch.allclose(tiny.sum(-2), b, atol=1e-6)
    assert torch.equal(tiny, rita.sinkhorn(base, a, b, 1e-3, 400, log_domain=True))


def test_stored_full_tier_run_matches_the_chapters_claims():
    """The stored rows belong to the chapter as it stands: one per paper claim and finding, each
    statement's opening in the chapter (a changed claim needs data/make_rita_full_tier.py)."""
    record = load_stored_run(rita.FULL_TIER_FILE, "rita")
    chapter = (rita.FULL_TIER_FILE.parents[1] / "book" / "chapters" / "rita.md").read_text()
    calls = chapter.count("claims.paper(") + chapter.count("claims.finding(")
    assert len(record["rows"]) == calls
    for row in record["rows"]:
        assert row["statement"][:40] in chapter, row["statement"]
    full = chapter[chapter.index("FULL = dict("):].split("\n\n")[0]
    seeds, adapt = (int(re.search(rf"{key}=(\d+)", full)[1]) for key in ("model_seeds", "n_adapt"))
    assert record["glued"]["n_models"] == 2 * seeds
    assert record["glued"]["n_adapt_per_model"] == adapt
    # what the chapter's prose says of the stored run
    ensemble, ot_reading, step, rtpt = (stored_row(record, prefix) for prefix in (
        "under attack RITA beats the plain ensemble", "ablation, OT reading",
        "ablation, prompt step: RITA beats", "under attack RITA beats R-TPT with"))
    assert 0 < ensemble["lower"] < ensemble["estimate"] < 0.011 < ensemble["upper"]
    assert ensemble["fragile"] and ot_reading["lower"] > 0
    assert step["lower"] < 0 < step["upper"] and rtpt["lower"] > 0 and rtpt["upper"] < 0.018
