"""Tests for icml26.hyperbolic_rq: ball operations against geoopt, exact RQ identities, IDs."""

import geoopt
import numpy as np
import pytest
import torch

import icml26.hyperbolic_rq as hr

F64 = torch.float64


def _points(n, d, c, seed, scale=0.9):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=F64)
    r = torch.rand(n, 1, generator=g, dtype=F64) * scale / c**0.5
    return x / x.norm(dim=-1, keepdim=True) * r


@pytest.mark.parametrize("c", [0.3, 1.0, 2.5])
def test_ball_operations_match_geoopt(c):
    ball = geoopt.PoincareBall(c=torch.tensor(c, dtype=F64))  # float64 curvature
    x, y = _points(200, 5, c, 0), _points(200, 5, c, 1)
    v = torch.randn(200, 5, dtype=F64) * 0.7
    assert torch.allclose(hr.mobius_add(x, y, c), ball.mobius_add(x, y), atol=1e-10)
    assert torch.allclose(hr.expmap0(v, c), ball.expmap0(v), atol=1e-10)
    assert torch.allclose(hr.logmap0(x, c), ball.logmap0(x), atol=1e-8)
    assert torch.allclose(hr.dist(x, y, c), ball.dist(x, y), atol=1e-8)


def test_mobius_identities():
    c = 1.0
    a, x, y = _points(100, 4, c, 2), _points(100, 4, c, 3), _points(100, 4, c, 4)
    # left cancellation and isometry of left translation
    assert torch.allclose(hr.mobius_add(a, hr.mobius_add(-a, x, c), c), x, atol=1e-12)
    tx, ty = hr.mobius_add(-a, x, c), hr.mobius_add(-a, y, c)
    assert torch.allclose(hr.dist(tx, ty, c), hr.dist(x, y, c), atol=1e-9)
    # neither commutative nor associative in general
    assert (hr.mobius_add(x, y, c) - hr.mobius_add(y, x, c)).abs().max() > 1e-3
    # exp/log are inverse, and dist(0, x) = 2 artanh(|x|)
    assert torch.allclose(hr.expmap0(hr.logmap0(x, c), c), x, atol=1e-12)
    zero = torch.zeros_like(x)
    assert torch.allclose(hr.dist(zero, x, c), 2 * torch.atanh(x.norm(dim=-1)), atol=1e-10)


@pytest.mark.parametrize("geometry", hr.GEOMETRIES)
def test_residual_quantisation_reconstructs_exactly(geometry):
    c = 1.0
    z = _points(300, 3, c, 5, scale=0.95)
    books = [_points(k, 3, c, 10 + k, scale=0.8) for k in (7, 5, 3)]
    codes, residuals = hr.residual_quantize(z, books, geometry, c)
    assert codes.shape == (300, 3) and len(residuals) == 4
    rebuilt = hr.reconstruct(books, codes, geometry, c, tail=residuals[-1])
    assert torch.allclose(rebuilt, z, atol=1e-10)
    # brute force: the chosen codeword is the nearest one in the tokenizer's distance
    r = residuals[1]
    if geometry == "hyperbolic":
        d = geoopt.PoincareBall(c=c).dist(r[:, None], books[1][None])
    else:
        d = torch.cdist(r, books[1])
    assert torch.equal(d.argmin(1), codes[:, 1])


def test_small_curvature_limit_is_euclidean_rq():
    # as c -> 0 Möbius addition tends to vector addition and d_c to twice the Euclidean distance,
    # so hyperbolic RQ must pick the same codes as Euclidean RQ on points well inside the ball
    c = 1e-6
    z = _points(200, 3, 1.0, 21, scale=1.0)
    books = [_points(k, 3, 1.0, 30 + k, scale=1.0) for k in (6, 4)]
    codes_h, res_h = hr.residual_quantize(z, books, "hyperbolic", c)
    codes_e, res_e = hr.residual_quantize(z, books, "euclidean", c)
    assert torch.equal(codes_h, codes_e)
    assert torch.allclose(res_h[-1], res_e[-1], atol=1e-4)
    assert torch.allclose(hr.dist(z, books[0][:1], c), 2 * (z - books[0][:1]).norm(dim=-1),
                          rtol=1e-4)


def test_collision_and_perplexity():
    codes = np.array([[0, 1], [0, 1], [1, 0], [1, 1]])
    assert hr.collision_rate(codes) == pytest.approx(0.25)
    ppl = hr.usage_perplexity(codes, (2, 2))
    assert ppl[0] == pytest.approx(1.0)
    assert ppl[1] == pytest.approx(np.exp(-(0.25 * np.log(0.25) + 0.75 * np.log(0.75))) / 2)
    assert hr.usage_perplexity(np.zeros((5, 1), dtype=int), (4,))[0] == pytest.approx(0.25)


def test_tokenizer_trains_and_separates_the_tree():
    cat = hr.make_catalogue(branching=(3, 2, 2), items_per_leaf=4, n_users=20, seed=0)
    for geometry in hr.GEOMETRIES:
        tok = hr.train_tokenizer(cat.features, (6, 4), geometry, epochs=60, warmup=20, seed=0)
        assert tok.losses[-1] < tok.losses[0]
        assert tok.codes.shape == (cat.n_items, 2)
        # the first code carries the top category far better than chance (1/3)
        top = cat.paths[:, 0]
        purity = sum(np.bincount(top[tok.codes[:, 0] == k]).max()
                     for k in np.unique(tok.codes[:, 0])) / cat.n_items
        assert purity > 0.8
        if geometry == "hyperbolic":
            assert float(tok.latent.norm(dim=-1).max()) < 1.0


def test_trie_beam_search_returns_valid_distinct_items():
    codes = np.array([[0, 0], [0, 0], [0, 1], [1, 2], [2, 2], [2, 2], [2, 2]])
    tokens = hr.dedup_tokens(codes)
    assert len(np.unique(tokens, axis=0)) == len(codes)
    trie = hr.build_trie(tokens)
    sessions = [np.array([0, 2, 3, 4, 5]), np.array([6, 1, 0, 2])]
    model, (test_h, _) = hr.train_recommender(tokens, sessions, 7, epochs=2, dim=8)
    ranked = hr.beam_search(model, trie, test_h, beam=10)
    for row in ranked:
        valid = row[row >= 0]
        assert len(valid) == 7 and len(set(valid.tolist())) == 7  # every item, once
        assert (row[7:] == -1).all()


def test_ranking_metrics():
    ranked = torch.tensor([[3, 1, 2], [0, 1, 2]])
    recall, ndcg = hr.ranking_metrics(ranked, torch.tensor([1, 5]), k=3)
    assert recall == pytest.approx(0.5)
    assert ndcg == pytest.approx(0.5 / np.log2(3))


def test_bad_input():
    x = torch.tensor([[0.9, 0.9]], dtype=F64)
    with pytest.raises(ValueError, match="outside"):
        hr.dist(x, torch.zeros_like(x))
    with pytest.raises(ValueError, match="c > 0"):
        hr.expmap0(torch.zeros(1, 2), c=-1.0)
    with pytest.raises(TypeError):
        hr.check_curvature("1")
    with pytest.raises(ValueError, match="non-empty"):
        hr.residual_quantize(torch.zeros(2, 2), [])
    with pytest.raises(ValueError, match="non-empty"):
        hr.residual_quantize(torch.zeros(2, 2), [torch.zeros(0, 2)])
    with pytest.raises(ValueError):
        hr.check_sizes((4, 0))
    with pytest.raises(ValueError, match="unknown item"):
        hr.make_examples([np.array([0, 1, 9])], n_items=5)
    with pytest.raises(ValueError, match="moves"):
        hr.make_catalogue(moves=(0.5, 0.5, 0.5, -0.5))
    with pytest.raises(ValueError, match="outside"):
        hr.residual_quantize(torch.tensor([[0.5, 0.5]], dtype=F64),
                             [torch.tensor([[1.5, 0.0]], dtype=F64)], "hyperbolic")
    with pytest.raises(ValueError, match="unique"):
        hr.build_trie(np.array([[0, 1], [0, 1]]))


def test_tangent_residual_reconstructs_and_is_a_tangent_subtraction():
    c = 0.7
    z = _points(200, 4, c, 40, scale=0.9)
    books = [_points(k, 4, c, 50 + k, scale=0.8) for k in (3, 6, 12)]
    codes, residuals = hr.residual_quantize(z, books, "hyperbolic", c, residual="tangent")
    t = hr.logmap0(z, c)
    for level, book in enumerate(books):
        # nearest codeword in hyperbolic distance (brute force with geoopt)
        d = geoopt.PoincareBall(c=c).dist(residuals[level][:, None], book[None])
        assert torch.equal(d.argmin(1), codes[:, level])
        t = t - hr.logmap0(book[codes[:, level]], c)
        assert torch.allclose(hr.logmap0(residuals[level + 1], c), t, atol=1e-9)
    rebuilt = hr.reconstruct(books, codes, "hyperbolic", c, tail=residuals[-1], residual="tangent")
    assert torch.allclose(rebuilt, z, atol=1e-10)
    # the two residuals differ: HG-Rec's tangent subtraction is not HRQ's Möbius subtraction
    codes_m, res_m = hr.residual_quantize(z, books, "hyperbolic", c, residual="mobius")
    assert (res_m[2] - residuals[2]).abs().max() > 1e-3
    with pytest.raises(ValueError, match="residual"):
        hr.residual_quantize(z, books, "hyperbolic", c, residual="right")


@pytest.mark.parametrize("residual", hr.RESIDUALS)
def test_codes_are_invariant_to_the_curvature(residual):
    # the ball of curvature -c is the unit ball scaled by 1/sqrt(c): same points, same codes
    t = hr.logmap0(_points(300, 3, 1.0, 60, scale=0.95), 1.0)
    out = []
    for c in (0.25, 1.0, 4.0):
        z = hr.expmap0(t / c**0.5, c)
        books = hr.fit_codebooks(z, (8, 6, 4), "hyperbolic", c, seed=3, residual=residual)
        out.append(hr.residual_quantize(z, books, "hyperbolic", c, residual=residual)[0])
    assert all(torch.equal(out[0], o) for o in out[1:])


def test_stacked_tokenizers_are_independent():
    cats = [hr.make_catalogue((3, 2, 2), 4, n_users=5, seed=s) for s in (0, 1, 2)]
    x = np.stack([cats[0].features, cats[1].features])
    y = np.stack([cats[0].features, cats[2].features])  # replicate 1 changed, replicate 0 not
    for geometry, residual in (("euclidean", "mobius"), ("hyperbolic", "tangent")):
        a = hr.train_tokenizers(x, (4, 3), geometry, residual=residual, epochs=15, warmup=5)
        b = hr.train_tokenizers(y, (4, 3), geometry, residual=residual, epochs=15, warmup=5)
        assert np.array_equal(a[0].codes, b[0].codes)
        assert torch.allclose(a[0].latent, b[0].latent, atol=1e-5)
        assert not torch.allclose(a[1].latent, b[1].latent)
        if geometry == "hyperbolic":
            assert 0.0 <= a[0].agreement <= 1.0
            assert float(a[0].latent.norm(dim=-1).max()) <= np.tanh(1.0) + 1e-5  # clip radius 1


def test_dead_codes_pyramid_and_clip():
    codes = np.array([[0, 1], [0, 1], [2, 0]])
    assert hr.dead_codes(codes, (3, 4)).tolist() == [1, 2]
    assert hr.pyramid(6, 2, 3) == (6, 12, 24)
    assert hr.pyramid(64, 2, 3) == (64, 128, 256)
    x = hr.make_catalogue((3, 2, 2), 4, n_users=5, seed=0).features
    with pytest.raises(ValueError, match="clip"):
        hr.train_tokenizer(x, (4,), "hyperbolic", clip=None, epochs=1)
    tok = hr.train_tokenizer(x, (4,), "euclidean", clip=0.5, epochs=2, warmup=1)
    assert float(tok.latent.norm(dim=-1).max()) <= 0.5 + 1e-6


def test_vq_weight_scales_the_codebook_and_commitment_terms():
    x = torch.from_numpy(hr.make_catalogue((3, 2, 2), 4, n_users=5, seed=0).features)[None]
    for geometry, clip in (("euclidean", None), ("hyperbolic", 1.0)):
        model = hr._StackedRQVAE(1, x.shape[2], 16, 4, (4, 3), geometry, 1.0, clip, "tangent",
                                 torch.Generator().manual_seed(0))
        with torch.no_grad():
            for book in model.books:
                book.normal_(0, 0.1, generator=torch.Generator().manual_seed(1))
            loss1, codes1, recon1 = model(x, 0.25, 1.0)
            loss4, codes4, recon4 = model(x, 0.25, 4.0)
        vq = loss1 - recon1.sum()
        assert float(vq) > 0 and torch.equal(codes1, codes4) and torch.equal(recon1, recon4)
        assert torch.allclose(loss4 - recon4.sum(), 4 * vq, rtol=1e-5)
    xs = hr.make_catalogue((3, 2, 2), 4, n_users=5, seed=0).features
    with pytest.raises(ValueError, match="vq_weight"):
        hr.train_tokenizer(xs, (4,), "euclidean", vq_weight=0.0, epochs=1)
    tok = hr.train_tokenizer(xs, (4, 3), "euclidean", clip=None, vq_weight=4.0, epochs=3,
                             warmup=1, track_collisions=True)
    assert tok.collisions.shape == (3,) and tok.reconstruction.shape == (3,)
    assert hr.epochs_to_reach([0.5, 0.3, 0.2], 0.3) == 2.0
    assert hr.epochs_to_reach([0.5, 0.4], 0.1) == float("inf")
    codes = torch.tensor([[[0, 1], [0, 1], [1, 0]], [[0, 0], [1, 1], [2, 2]]])
    assert np.allclose(hr._collision_rates(codes, (3, 3)), [1 / 3, 0.0])


def test_clip_grid_equals_separate_runs():
    cats = [hr.make_catalogue((3, 2, 2), 4, n_users=5, seed=s) for s in (0, 1)]
    x = np.stack([c.features for c in cats])
    for geometry, residual, clips in (("euclidean", "mobius", (None, 0.5)),
                                      ("hyperbolic", "tangent", (0.5, 2.0))):
        grid = hr.train_tokenizers_clips(x, (4, 3), geometry, clips=clips, residual=residual,
                                         epochs=6, warmup=3, seed=4)
        for clip in clips:
            alone = hr.train_tokenizers(x, (4, 3), geometry, clip=clip, residual=residual,
                                        epochs=6, warmup=3, seed=4)
            for a, b in zip(grid[clip], alone, strict=True):
                assert np.array_equal(a.codes, b.codes)
                assert torch.allclose(a.latent, b.latent, atol=1e-6)
    with pytest.raises(ValueError, match="distinct"):
        hr.train_tokenizers_clips(x, (4,), "euclidean", clips=(1.0, 1.0), epochs=1)


def test_tangent_forward_matches_the_generic_loss():
    """The tangent-space shortcut of the training step gives the loss of the written-out
    objective: codes by residual_quantize, codebook + beta * commitment distances, reconstruction
    through the straight-through tangent vector."""
    x = torch.as_tensor(hr.make_catalogue((3, 2, 2), 4, n_users=5, seed=0).features)[None]
    model = hr._StackedRQVAE(1, x.shape[2], 16, 4, (4, 3), "hyperbolic", 1.0, 1.0, "tangent",
                             torch.Generator().manual_seed(0))
    with torch.no_grad():
        for book in model.books:
            book.normal_(0, 0.3)
    loss, codes, _ = model(x, 0.25, 2.0)
    z = model.encode(x)
    books = model.codewords()
    ref_codes, residuals = hr.residual_quantize(z[0], [b[0] for b in books], "hyperbolic", 1.0,
                                                residual="tangent")
    assert torch.equal(codes[0], ref_codes)
    vq = sum((1.25 * hr.dist(r, b[0][k], 1.0).pow(2)).mean()
             for r, b, k in zip(residuals[:-1], books, ref_codes.T, strict=True))
    tq = sum(model.books[level][0][k] for level, k in enumerate(ref_codes.T))
    recon = (model.decode(tq[None]) - x).pow(2).sum(-1).mean()
    assert torch.allclose(loss, recon + 2.0 * vq, rtol=1e-5)
