"""Tests for RaBiT: residual binary paths, STE gradients, inits, RTN, packed inference, QAT."""

import numpy as np
import pytest
import torch

from icml26 import nn as tnn
from icml26 import rabit as rb


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def layer_data():
    """A weight and calibration inputs with very unequal input-channel scales."""
    W = torch.randn(24, 40, generator=gen(1), dtype=torch.float64) * 0.05
    X = torch.randn(400, 40, generator=gen(2), dtype=torch.float64)
    X = X * torch.linspace(0.1, 3.0, 40, dtype=torch.float64)
    return W, X


@pytest.mark.parametrize("shape, bits", [((64, 96), 2), ((7, 300), 2), ((5, 13), 3),
                                         ((16, 16), 4), ((8, 5), 1)])
def test_rtn_matches_torch_fake_quantize_exactly(shape, bits):
    W = torch.randn(shape, generator=gen(3)) * 0.05
    W[0] = W[0].abs()  # a row without negative entries exercises the zero clamp
    fake, scale, zero_point = rb.rtn_quantize(W, bits)
    reference = torch.fake_quantize_per_channel_affine(W, scale, zero_point, 0, 0, 2**bits - 1)
    assert torch.equal(fake, reference)
    assert all(len(torch.unique(row)) <= 2**bits for row in fake)


def test_rtn_is_round_to_nearest_on_its_grid():
    W = torch.randn(6, 50, generator=gen(4))
    fake, scale, zero_point = rb.rtn_quantize(W, 2)
    grid = (torch.arange(4)[None, :] - zero_point[:, None]) * scale[:, None]
    nearest = grid.gather(1, (W[:, :, None] - grid[:, None, :]).abs().argmin(-1))
    torch.testing.assert_close(fake, nearest)


def test_svid_is_exact_for_rank_one_magnitudes():
    u, v = torch.rand(9, generator=gen(5)) + 0.1, torch.rand(14, generator=gen(6)) + 0.1
    signs = torch.where(torch.rand(9, 14, generator=gen(7)) > 0.5, 1.0, -1.0)
    M = signs * torch.outer(u, v)
    b, g, h = rb.svid(M)
    assert torch.equal(b, signs) and (g > 0).all() and (h > 0).all()
    torch.testing.assert_close(g[:, None] * b * h[None, :], M)


def test_residual_paths_sum_and_shrinking_error(layer_data):
    W, _ = layer_data
    errors = []
    for P in (1, 2, 3, 4):
        paths = rb.residual_svid(W, P)
        torch.testing.assert_close(paths.weight(), sum(
            paths.out_scales[p][:, None] * paths.signs[p] * paths.in_scales[p][None]
            for p in range(P)))
        errors.append(((W - paths.weight()) ** 2).mean().item())
    assert errors == sorted(errors, reverse=True) and errors[3] < 0.2 * errors[0]


def test_scalar_scale_optimality_and_orthogonal_residual():
    w = torch.randn(200, generator=gen(8), dtype=torch.float64)
    b = torch.sign(w)
    alpha = w.abs().mean()  # weight-optimal scale for fixed signs
    assert torch.dot(w - alpha * b, b).abs() < 1e-10
    grid = torch.linspace(0.5 * alpha, 1.5 * alpha, 101, dtype=torch.float64)
    losses = ((w[None] - grid[:, None] * b[None]) ** 2).sum(1)
    assert grid[losses.argmin()] == pytest.approx(alpha.item(), rel=0.011)


def test_output_scales_solve_the_per_row_least_squares(layer_data):
    W, X = layer_data
    sigma = X.T @ X / len(X)
    paths = rb.residual_svid(W, 2)
    refit = rb.refit_out_scales(W, paths, sigma, ridge=0.0)
    for i in range(W.shape[0]):  # brute force: weighted least squares with numpy
        A = (paths.signs[:, i] * paths.in_scales).T.numpy()
        root = np.linalg.cholesky(sigma.numpy()).T
        g, *_ = np.linalg.lstsq(root @ A, root @ W[i].numpy(), rcond=None)
        np.testing.assert_allclose(refit.out_scales[:, i].numpy(), g, rtol=1e-7, atol=1e-12)
    assert rb.output_error(W, refit.weight(), X) < rb.output_error(W, paths.weight(), X)


def test_function_aware_init_beats_weight_svid_on_outputs(layer_data):
    W, X = layer_data
    weight_init = rb.residual_svid(W, 2)
    function_init = rb.function_aware_init(W, X, 2)
    assert (rb.output_error(W, function_init.weight(), X)
            < 0.95 * rb.output_error(W, weight_init.weight(), X))


@pytest.mark.parametrize("P", [2, 3])
@pytest.mark.parametrize("mode", rb.MODES)
def test_layers_start_from_exactly_the_initial_paths(layer_data, mode, P):
    W, X = layer_data
    paths = rb.function_aware_init(W, X, P)
    layer = rb.ResidualBinaryLinear(W, paths, mode=mode)
    assert torch.equal(layer.weight(), paths.weight())
    exported = layer.export()
    assert torch.equal(exported.signs, paths.signs)
    x = X[:5]
    torch.testing.assert_close(layer(x), x @ paths.weight().T)


def test_consistent_latent_is_the_weight_where_its_own_signs_agree(layer_data):
    W, _ = layer_data
    paths = rb.residual_svid(W, 2)  # greedy: B1 = sign(W), B2 = sign(W - W1)
    latent = rb.consistent_latent(W, paths)
    agree = (paths.signs[1] == torch.sign(W - paths.path_weights()[0]))
    assert agree.all()
    inside = (W - paths.path_weights()[0]).abs() > 1e-3 * paths.path_weights()[0].abs()
    torch.testing.assert_close(latent[inside & (W.abs() > 1e-4)], W[inside & (W.abs() > 1e-4)])


def test_consistent_latent_with_negative_scales_reproduces_the_signs():
    """Where a least-squares refit makes G_1 < 0 (or G_2 < 0), the latent must still give back
    every sign: the offsets accumulate the signed G_p b_p."""
    generator = gen(5)
    W = torch.randn(12, 30, generator=generator, dtype=torch.float64) * 0.05
    for P in (2, 3):
        g = torch.rand(P, 12, generator=generator, dtype=torch.float64) * 0.04 + 0.01
        h = torch.rand(P, 30, generator=generator, dtype=torch.float64) + 0.5
        g[0, :6] *= -1  # G_1 < 0 on half the rows
        g[1, ::3] *= -1  # and G_2 < 0 on a third
        # signs that some latent produces, so every entry's interval is non-empty
        source = torch.randn(12, 30, generator=generator, dtype=torch.float64) * 0.05
        signs = []
        for p in range(P):
            signs.append(rb.binary_sign(source))
            source = source - g[p, :, None] * signs[-1] * h[p]
        paths = rb.BinaryPaths(torch.stack(signs), g, h)
        assert (paths.out_scales[0, :, None] * paths.in_scales[0] < 0).any()
        latent = rb.consistent_latent(W, paths)
        residual = latent.clone()
        for p in range(P):
            assert torch.equal(rb.binary_sign(residual), paths.signs[p]), (P, p)
            residual = residual - paths.path_weights()[p]
        layer = rb.ResidualBinaryLinear(W, paths, mode="rabit")
        assert torch.equal(layer.weight(), paths.weight())


def test_positive_scales_keep_the_weight_and_make_the_start_exact(layer_data):
    W, X = layer_data
    paths = rb.function_aware_init(W, X, 2)
    negative = rb.BinaryPaths(paths.signs.clone(), paths.out_scales.clone(),
                              paths.in_scales.clone())
    negative.out_scales[0, ::2] *= -1  # G_1 < 0 on every other row ...
    negative.signs[0, ::2] *= -1  # ... with the same path weights
    negative.in_scales[1, :5] *= -1
    negative.signs[1, :, :5] *= -1
    torch.testing.assert_close(negative.weight(), paths.weight())
    fixed = rb.positive_scales(negative)
    assert (fixed.out_scales >= 0).all() and (fixed.in_scales >= 0).all()
    torch.testing.assert_close(fixed.weight(), paths.weight())
    for mode in rb.MODES:
        layer = rb.ResidualBinaryLinear(W, fixed, mode=mode)
        torch.testing.assert_close(layer.weight(), paths.weight(), rtol=0, atol=1e-15)


def test_every_tinygpt_layer_starts_from_its_initial_paths(tiny_teacher):
    teacher, tokens = tiny_teacher
    for init in rb.INITS:
        paths = rb.initial_paths(teacher, tokens[:8, :8], init=init)
        for method in ("independent", "rabit"):
            student = rb.build_quantized(teacher, method, paths)
            assert rb.start_gap(student, paths) == 0.0


def test_rabit_with_two_paths_is_nearest_level_quantisation():
    g1, h1 = torch.tensor([0.5]), torch.tensor([1.0])
    g2, h2 = torch.tensor([0.2]), torch.tensor([1.0])
    paths = rb.BinaryPaths(torch.ones(2, 1, 1), torch.stack([g1, g2]), torch.stack([h1, h2]))
    layer = rb.ResidualBinaryLinear(torch.ones(1, 1), paths, mode="rabit")
    levels = torch.tensor([-0.7, -0.3, 0.3, 0.7])  # +-G1 +- G2
    for value in torch.linspace(-1.2, 1.2, 241):
        if min(abs(value.item() - t) for t in (-0.5, 0.0, 0.5)) < 1e-6:
            continue  # ties at the thresholds +-G1 and 0 may go either way
        with torch.no_grad():
            layer.latents[0].fill_(value)
        nearest = levels[(levels - value).abs().argmin()]
        assert layer.weight().item() == pytest.approx(nearest.item(), abs=1e-7), value


def test_sign_agreement_lemma_for_independent_paths(layer_data):
    W, X = layer_data
    paths = rb.function_aware_init(W, X, 2)
    assert (paths.out_scales > 0).all() and (paths.in_scales > 0).all()
    layer = rb.ResidualBinaryLinear(W, paths, mode="independent")
    target = torch.randn(50, 24, generator=gen(9), dtype=torch.float64)
    ((layer(X[:50]) - target) ** 2).sum().backward()
    grad1, grad2 = (p.grad for p in layer.latents)
    assert torch.equal(torch.sign(grad1), torch.sign(grad2))
    # STE: each latent gradient is the weight gradient times G_p = g_p h_p^T
    weight_grad = 2 * (X[:50] @ paths.weight().T - target).T @ X[:50]
    G = paths.out_scales[:, :, None] * paths.in_scales[:, None, :]
    torch.testing.assert_close(grad1, G[0] * weight_grad)
    torch.testing.assert_close(grad2, G[1] * weight_grad)


def test_rabit_latent_gradient_formula(layer_data):
    W, X = layer_data
    paths = rb.function_aware_init(W, X, 2)
    layer = rb.ResidualBinaryLinear(W, paths, mode="rabit")
    target = torch.randn(50, 24, generator=gen(10), dtype=torch.float64)
    ((layer(X[:50]) - target) ** 2).sum().backward()
    weight_grad = 2 * (X[:50] @ paths.weight().T - target).T @ X[:50]
    G1, G2 = paths.out_scales[:, :, None] * paths.in_scales[:, None, :]
    torch.testing.assert_close(layer.latents[0].grad, (G1 + G2 * (1 - G1)) * weight_grad)


def test_freezing_keeps_path_one_and_trains_path_two(layer_data):
    W, X = layer_data
    paths = rb.function_aware_init(W, X, 2)
    layer = rb.ResidualBinaryLinear(W, paths, mode="independent", frozen=1)
    before = [p.detach().clone() for p in layer.parameters()]
    optimizer = torch.optim.SGD([p for p in layer.parameters() if p.requires_grad], lr=0.1)
    ((layer(X[:50]) - 1.0) ** 2).mean().backward()
    optimizer.step()
    after = dict(layer.named_parameters())
    names = [n for n, _ in layer.named_parameters()]
    for name, old in zip(names, before, strict=True):
        changed = not torch.equal(after[name], old)
        assert changed == name.endswith(".1"), name
    assert layer.latent_elements == W.numel()


def test_rabit_keeps_half_the_latent_weights(layer_data):
    W, X = layer_data
    paths = rb.function_aware_init(W, X, 2)
    assert rb.ResidualBinaryLinear(W, paths, mode="rabit").latent_elements == W.numel()
    assert rb.ResidualBinaryLinear(W, paths, mode="independent").latent_elements == 2 * W.numel()


@pytest.mark.parametrize("m, n", [(13, 40), (7, 21), (64, 8)])
def test_packed_matvec_equals_the_dense_product(m, n):
    rng = np.random.default_rng(m * n)
    signs = torch.as_tensor(rng.choice([-1.0, 1.0], size=(2, m, n)))
    paths = rb.BinaryPaths(signs, torch.as_tensor(rng.random((2, m))),
                           torch.as_tensor(rng.random((2, n))))
    packed = rb.PackedResidualBinary.from_paths(paths)
    x = rng.standard_normal(n).astype(np.float32)
    dense = paths.weight().numpy() @ x
    np.testing.assert_allclose(packed.matvec(x), dense, rtol=1e-4, atol=1e-4)
    assert packed.packed.shape == (2, m, -(-n // 8)) and packed.packed.dtype == np.uint8
    assert packed.nbytes == 2 * m * -(-n // 8) + 2 * 2 * (m + n)


def test_subset_sum_table_and_packing():
    z = np.arange(1.0, 17.0)
    table = rb.subset_sum_table(z)
    for value in (0, 1, 5, 128, 255):
        bits = [(value >> i) & 1 for i in range(8)]
        assert table[1, value] == sum(b * z[8 + i] for i, b in enumerate(bits))
    assert rb.pack_signs(np.array([1, -1, -1, 1, -1, -1, -1, -1]))[0] == 0b1001
    with pytest.raises(ValueError, match="signs"):
        rb.pack_signs(np.array([1, 0, -1]))


def test_bits_per_weight_and_decode_traffic():
    assert rb.bits_per_weight(4096, 4096, 2) == pytest.approx(2 + 32 * 8192 / 4096**2)
    assert rb.bits_per_weight(64, 64, 2) == pytest.approx(3.0)
    traffic = rb.llama_decode_traffic()
    assert traffic.fp16_bytes == pytest.approx(2 * 6_476_005_376 + 2 * 32000 * 4096)
    assert 6.0 < traffic.speedup_bound < 8.0


@pytest.fixture(scope="module")
def tiny_teacher():
    config = tnn.GPTConfig(vocab_size=8, context=8, d_model=16, n_layers=1, n_heads=2)
    tokens = torch.randint(8, (40, 9), generator=gen(11))
    return tnn.TinyGPT(config, seed=0).eval(), tokens


def test_quantised_model_starts_from_the_initial_function(tiny_teacher):
    teacher, tokens = tiny_teacher
    paths = rb.initial_paths(teacher, tokens[:8, :8])
    reference = tnn.TinyGPT(teacher.config)
    reference.load_state_dict(teacher.state_dict())
    with torch.no_grad():
        for name, layer in tnn.linear_layers(reference).items():
            layer.weight.copy_(paths[name].weight())
    for method in ("independent", "freeze", "rabit"):
        student = rb.build_quantized(teacher, method, paths)
        with torch.no_grad():
            torch.testing.assert_close(student(tokens[:, :8]), reference(tokens[:, :8]))
        trainable = {n for n, p in student.named_parameters() if p.requires_grad}
        assert trainable and all(".latents." in n or "_scales." in n or n.endswith(".bias")
                                 for n in trainable)
    assert rb.model_bits_per_weight(rb.build_quantized(teacher, "rabit", paths)) > 2.0


def test_qat_is_deterministic_and_reports_correlations(tiny_teacher):
    teacher, tokens = tiny_teacher
    paths = rb.initial_paths(teacher, tokens[:8, :8], init="weight")
    runs = [rb.run_qat(teacher, "rabit", paths, tokens, tokens, steps=4, lr=1e-3, seed=1,
                       batch_size=4, probe_tokens=tokens[:4, :8], probe_every=2)
            for _ in range(2)]
    assert runs[0].losses == runs[1].losses and runs[0].valid_nll == runs[1].valid_nll
    assert runs[0].correlation_steps == [0, 2, 4]
    assert all(-1 <= c <= 1 for c in runs[0].correlations)
    indep = rb.build_quantized(teacher, "independent", paths)
    assert rb.latent_elements(indep) == 2 * rb.latent_elements(runs[0].model)
    assert rb.optimizer_state_elements(indep) > rb.optimizer_state_elements(runs[0].model)


def test_rtn_model_changes_only_block_linears(tiny_teacher):
    teacher, _ = tiny_teacher
    quantized = rb.rtn_model(teacher, 2)
    for (name, a), b in zip(teacher.state_dict().items(), quantized.state_dict().values(),
                            strict=True):
        is_block_weight = name.startswith("blocks.") and ("qkv.weight" in name
                                                         or "proj.weight" in name
                                                         or "fc_" in name and "weight" in name)
        assert torch.equal(a, b) != is_block_weight, name


def test_bad_input_is_refused(layer_data):
    W, X = layer_data
    with pytest.raises(ValueError, match="2-D"):
        rb.residual_svid(W[0], 2)
    with pytest.raises(ValueError, match="2-D"):
        rb.rtn_quantize(W[None], 2)
    with pytest.raises(ValueError, match="at least 1"):
        rb.residual_svid(W, 0)
    with pytest.raises(TypeError, match="integer"):
        rb.function_aware_init(W, X, 2.0)
    with pytest.raises(ValueError, match="width"):
        rb.function_aware_init(W, X[:, :30], 2)
    with pytest.raises(ValueError, match="2-D tensor"):
        rb.function_aware_init(W, X[0], 2)
    with pytest.raises(ValueError, match="mode"):
        rb.ResidualBinaryLinear(W, rb.residual_svid(W, 2), mode="parallel")
    with pytest.raises(ValueError, match="independent paths only"):
        rb.ResidualBinaryLinear(W, rb.residual_svid(W, 2), mode="rabit", frozen=1)
    with pytest.raises(ValueError, match="NaN"):
        rb.residual_svid(W * torch.nan, 2)
    with pytest.raises(TypeError):
        rb.residual_svid(W.numpy(), 2)
    with pytest.raises(ValueError, match="bits"):
        rb.rtn_quantize(W, 0)
    with pytest.raises(ValueError, match="method"):
        rb.build_quantized(torch.nn.Linear(2, 2), "rtn", {})


@pytest.mark.parametrize("ste", rb.STES)
def test_path_ste_forward_and_gradients(ste):
    r = torch.tensor([-1.5, -0.3, -0.05, 0.02, 0.4, 2.0], dtype=torch.float64,
                     requires_grad=True)
    G = torch.full_like(r, 0.1).requires_grad_(True)
    delta = torch.arange(1.0, 7.0, dtype=torch.float64)
    path = rb.path_ste(r, G, ste)
    torch.testing.assert_close(path.detach(), 0.1 * torch.where(r >= 0, 1.0, -1.0).double())
    (path * delta).sum().backward()
    inside = {"identity": torch.ones_like(r), "clipped": (r.abs() <= 1).double(),
              "scale": (r.abs() <= 0.1).double()}[ste]
    factor = 1.0 if ste == "scale" else 0.1
    torch.testing.assert_close(r.grad, factor * inside.detach() * delta)
    torch.testing.assert_close(G.grad, torch.where(r >= 0, 1.0, -1.0).double() * delta)


def test_scale_relative_ste_is_equivariant_and_identity_is_not(layer_data):
    W, X = layer_data
    paths = rb.function_aware_init(W, X, 2)
    grads = {}
    for ste in ("identity", "scale"):
        for c in (1.0, 10.0):
            scaled = rb.BinaryPaths(paths.signs, c * paths.out_scales, paths.in_scales)
            layer = rb.ResidualBinaryLinear(c * W, scaled, mode="rabit", ste=ste)
            delta = torch.randn(W.shape, generator=gen(4), dtype=torch.float64)
            (layer.weight() * delta).sum().backward()
            grads[ste, c] = layer.latents[0].grad
    torch.testing.assert_close(grads["scale", 1.0], grads["scale", 10.0])
    assert not torch.allclose(grads["identity", 10.0], 10 * grads["identity", 1.0])
    G1, G2 = paths.out_scales[:, :, None] * paths.in_scales[:, None, :]
    latent = rb.consistent_latent(W, paths)
    inner = (latent.abs() <= G1).double()
    residual = latent - G1 * rb.binary_sign(latent)
    outer = (residual.abs() <= G2).double()
    delta = torch.randn(W.shape, generator=gen(4), dtype=torch.float64)
    torch.testing.assert_close(grads["scale", 1.0], (inner + outer * (1 - inner)) * delta)


def test_ordering_violations_counts_entries():
    signs = torch.ones(2, 2, 3)
    paths = rb.BinaryPaths(signs, torch.tensor([[1.0, 1.0], [0.5, 2.0]]), torch.ones(2, 3))
    assert rb.ordering_violations(paths) == pytest.approx(0.5)
    negative = rb.BinaryPaths(signs, torch.tensor([[1.0, 1.0], [-0.5, 0.5]]), torch.ones(2, 3))
    assert rb.ordering_violations(negative) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        rb.ordering_violations(rb.BinaryPaths(torch.ones(1, 2, 3), torch.ones(1, 2),
                                              torch.ones(1, 3)))


def test_uniform_qat_layer_has_four_levels_and_trains(layer_data):
    W, X = layer_data
    layer = rb.UniformQATLinear(W, bits=2)
    weight = layer.weight()
    for row, step in zip(weight.detach(), layer.step.detach(), strict=True):
        levels = torch.unique(torch.round(row / step))
        assert set(levels.tolist()) <= {-2.0, -1.0, 0.0, 1.0}
    ((layer(X[:20])) ** 2).sum().backward()
    assert layer.latent.grad.abs().sum() > 0 and layer.step.grad.abs().sum() > 0
    assert rb.uniform_bits_per_weight([(4, 8)], bits=2) == pytest.approx(2 + 16 / 8)
    assert rb.uniform_bits_per_weight([(4, 8), (2, 4)], bits=2, zero_point_bits=2) == \
        pytest.approx((4 * 8 * 2 + 4 * 18 + 2 * 4 * 2 + 2 * 18) / 40)


def test_lsq_method_trains_deterministically(tiny_teacher):
    teacher, tokens = tiny_teacher
    paths = rb.initial_paths(teacher, tokens[:8, :8], init="weight")
    runs = [rb.run_qat(teacher, "lsq", paths, tokens, tokens, steps=3, lr=1e-3, seed=1,
                       batch_size=4, probe_tokens=tokens[:4, :8], probe_every=1)
            for _ in range(2)]
    assert runs[0].losses == runs[1].losses and runs[0].correlations == []


def test_stacked_training_matches_separate_runs(tiny_teacher):
    """Two replicates trained at once (different seeds and rates) follow the same trajectories as
    two ordinary runs of nn.train with the distillation loss."""
    from icml26.rabit import stacked

    teacher, tokens = tiny_teacher
    for parameter in teacher.parameters():
        parameter.requires_grad_(False)
    paths = rb.initial_paths(teacher, tokens[:8, :8])
    students = [rb.build_quantized(teacher, "rabit", paths) for _ in range(2)]
    trainable, fixed = stacked.stack_parameters(students)
    teacher_stack = {n: torch.stack([p.detach()] * 2) for n, p in teacher.named_parameters()}
    stacked.train_stacked(students[0], trainable, fixed, tokens, steps=5, lrs=[1e-3, 3e-3],
                          seeds=[1, 2], batch_size=4, teacher=(teacher, teacher_stack))
    for index, (lr, seed) in enumerate(((1e-3, 1), (3e-3, 2))):
        reference = rb.run_qat(teacher, "rabit", paths, tokens, tokens, steps=5, lr=lr,
                               seed=seed, batch_size=4)
        mine = stacked.replicate(students[0], trainable, index)
        for (name, a), b in zip(reference.model.named_parameters(),
                                mine.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)
    nll = stacked.stacked_nll(students[0], {**fixed, **trainable}, tokens, min_context=1)
    assert nll.shape == (2,)
    assert abs(nll[0].item() - tnn.evaluate_nll(stacked.replicate(students[0], trainable, 0),
                                               tokens, min_context=1)) < 1e-5


def test_replicate_metrics_are_per_replicate_and_subset_splits(tiny_teacher):
    """Flip rates are fractions of one replicate's signs (they do not shrink with the number of
    replicates), RaBiT never skips a level at a small rate, and ``subset`` splits a stack."""
    teacher, tokens = tiny_teacher
    paths = rb.initial_paths(teacher, tokens[:8, :8])
    kwargs = dict(steps=4, lr=3e-2, batch_size=4)
    one = rb.qat_replicates(teacher, "independent", [paths], tokens, seeds=[1], **kwargs)
    two = rb.qat_replicates(teacher, "independent", [paths, paths], tokens, seeds=[1, 1], **kwargs)
    np.testing.assert_allclose(two.flips, np.repeat(one.flips, 2, axis=0), atol=1e-6)
    assert one.flips.max() > 0
    rabit = rb.qat_replicates(teacher, "rabit", [paths, paths], tokens, seeds=[1, 2],
                              steps=4, lr=1e-3, batch_size=4)
    assert rabit.level_skips.sum() == 0 and rabit.level_changes.sum() > 0
    part = rabit.subset([1])
    assert part.count == 1 and part.flips[0].tolist() == rabit.flips[1].tolist()
    np.testing.assert_allclose(part.nll(tokens, min_context=1),
                               rabit.nll(tokens, min_context=1)[1:], rtol=1e-6)


def test_rabit_skips_only_where_a_step_outruns_the_gap(tiny_teacher):
    """RaBiT's level index is monotone in its latent (thresholds -G_1, 0, G_1), so it skips a
    level only where one step moves the latent farther than G_1 (or G_1 <= 0): with steps large
    against the scales it does skip, and every skip is of that kind; independent paths count none
    as unexplained (the count is RaBiT's)."""
    teacher, tokens = tiny_teacher
    paths = rb.initial_paths(teacher, tokens[:8, :8])
    kwargs = dict(steps=6, lr=3e-2, batch_size=4, seeds=[1, 2])
    rabit = rb.qat_replicates(teacher, "rabit", [paths, paths], tokens, **kwargs)
    assert rabit.level_skips.sum() > 0
    assert rabit.unexplained_skips.tolist() == [0.0, 0.0]
    assert rabit.subset([1]).unexplained_skips.tolist() == [0.0]
    independent = rb.qat_replicates(teacher, "independent", [paths, paths], tokens, **kwargs)
    assert independent.level_skips.sum() > 0 and independent.unexplained_skips.sum() == 0


def test_replicates_may_quantise_different_teachers(tiny_teacher):
    """With one teacher per replicate, replicate r quantises and distils from teacher r: it
    matches a one-replicate run on that teacher alone, and a wrong count is refused."""
    teacher, tokens = tiny_teacher
    other = tnn.TinyGPT(teacher.config, seed=5)
    tnn.train(other, tokens, steps=3, batch_size=4, lr=1e-2, seed=5)
    paths = [rb.initial_paths(t, tokens[:8, :8]) for t in (teacher, other)]
    kwargs = dict(steps=3, lr=1e-3, batch_size=4)
    both = rb.qat_replicates([teacher, other], "independent", paths, tokens, seeds=[1, 2],
                             **kwargs)
    alone = rb.qat_replicates(other, "independent", paths[1:], tokens, seeds=[2], **kwargs)
    np.testing.assert_allclose(both.nll(tokens, min_context=1)[1:],
                               alone.nll(tokens, min_context=1), rtol=1e-5)
    np.testing.assert_allclose(both.losses[:, 1].numpy(), alone.losses[:, 0].numpy(), rtol=1e-3,
                               atol=1e-7)
    with pytest.raises(ValueError, match="one teacher per replicate"):
        rb.qat_replicates([teacher], "rabit", paths, tokens, seeds=[1, 2], **kwargs)


@pytest.mark.parametrize("method", ["independent", "rabit"])
def test_flip_rates_agree_with_the_path_signs(tiny_teacher, method):
    """The tracked per-path flip rates equal those computed from the path signs (Eq.
    `eq-rabit` for RaBiT) of the trained stack against the initial paths."""
    teacher, tokens = tiny_teacher
    paths = rb.initial_paths(teacher, tokens[:8, :8])
    run = rb.qat_replicates(teacher, method, [paths], tokens, seeds=[3], steps=4, lr=3e-2,
                            batch_size=4)
    params = {**run.fixed, **run.trainable}
    mode = "rabit" if method == "rabit" else "independent"
    flipped, total = np.zeros(2), 0
    for name, start in paths.items():
        end = rb.stacked_path_signs(params, name, mode, 2)[0]
        for p in range(2):
            flipped[p] += (end[p] != start.signs[p].to(end.dtype)).sum().item()
        total += start.signs[0].numel()
    np.testing.assert_allclose(run.flips[0], flipped / total, atol=1e-12)
    assert flipped.sum() > 0
