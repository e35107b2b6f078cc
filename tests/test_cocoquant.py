"""Tests of icml26.cocoquant: quantisers, wire format, tensor parallelism, cost model, ILP."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from icml26 import cocoquant as cq
from icml26 import nn as tnn

CFG = tnn.GPTConfig(vocab_size=16, context=8, d_model=16, n_layers=2, n_heads=4, d_mlp=32)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = tnn.TinyGPT(CFG, seed=1).eval()
    with torch.no_grad():  # larger weights than the GPT-2 init, so quantisation matters
        for p in m.parameters():
            p.mul_(5.0)
    return m


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 16, (3, 8), generator=torch.Generator().manual_seed(2))


# --- quantisers and the wire format ------------------------------------------------------------


@pytest.mark.parametrize("bits", [4, 8])
def test_quantiser_error_is_at_most_half_a_step(bits):
    x = torch.randn(50, 37, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    codes, scale = cq.quantise_rows(x, bits)
    assert codes.abs().max() <= 2 ** (bits - 1) - 1
    assert ((codes.double() * scale - x).abs() <= scale / 2 + 1e-15).all()
    # the largest entry of each row is represented exactly
    assert torch.allclose((codes.double() * scale).abs().amax(-1), x.abs().amax(-1))


def test_int4_packing_round_trips_every_code():
    codes = torch.tensor(list(itertools.product(range(-7, 8), repeat=2)), dtype=torch.int8)
    packed = cq.pack_int4(codes)
    assert packed.dtype == torch.uint8 and packed.shape == (225, 1)
    assert torch.equal(cq.unpack_int4(packed), codes)
    with pytest.raises(ValueError, match="even"):
        cq.pack_int4(torch.zeros(2, 3, dtype=torch.int8))


@pytest.mark.parametrize("precision,ratio", [("c8", 0.5), ("c4", 0.25)])
def test_payload_is_a_half_or_a_quarter_plus_scales(precision, ratio):
    rows, width = 10, 24
    partial = torch.randn(rows, width, dtype=torch.float64)
    payload = cq.encode_partial(partial, precision)
    fp16 = cq.encode_partial(partial, "c16")
    assert fp16.numel() == rows * width * 2
    assert payload.numel() == cq.payload_bytes(rows, width, precision)
    assert payload.numel() / fp16.numel() == pytest.approx(ratio + 1 / width)  # 2-byte scales


@pytest.mark.parametrize("precision", ["c16", "c8", "c4"])
def test_decoded_sum_matches_fake_quantisation(precision):
    gen = torch.Generator().manual_seed(4)
    partials = [torch.randn(6, 8, dtype=torch.float64, generator=gen) for _ in range(3)]
    payloads = [cq.encode_partial(p, precision) for p in partials]
    total = cq.decode_sum(payloads, 6, 8, precision)
    if precision == "c16":
        expected = sum(p.half().double() for p in partials)
        assert torch.equal(total, expected)
    else:
        bits = cq.comm_bits(precision)
        error = (total - sum(partials)).abs()
        step = sum(p.abs().amax(-1, keepdim=True) / (2 ** (bits - 1) - 1) for p in partials)
        assert (error <= step / 2 * 1.01).all()


def test_unknown_precisions_are_rejected():
    with pytest.raises(ValueError, match="unknown GEMM precision"):
        cq.gemm_bits("w3a3")
    with pytest.raises(ValueError, match="unknown communication precision"):
        cq.comm_bits("c2")
    with pytest.raises(ValueError, match="unknown precision"):
        cq.check_config(dict(cq.uniform_config(2), **{"0.qkv": "c8"}), 2)
    with pytest.raises(ValueError, match="lacks"):
        cq.check_config({"0.qkv": "w8a8"}, 2)


# --- tensor parallelism ----------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_unquantised_split_equals_the_model(model, tokens, world_size):
    config = cq.uniform_config(2)
    # with float16 communication the partial sums are rounded; compare at float16 precision
    sim = cq.simulate_logits(model, tokens, config, world_size)
    with torch.no_grad():
        reference = model.double()(tokens)
    model.float()
    assert (sim - reference).abs().max() < 2e-2 * reference.abs().max()


def test_split_with_exact_communication_is_exact(model, tokens):
    replicated, shards = cq.shard_model(model, cq.uniform_config(2), 2)
    with torch.no_grad():
        logits = cq.tp_forward(tokens, replicated, shards, 2, cq.uniform_config(2),
                               lambda site, parts: sum(parts))
        reference = model.double()(tokens)
    model.float()
    assert torch.allclose(logits, reference, atol=1e-10, rtol=0)


def test_world_size_must_divide_heads_and_width(model, tokens):
    with pytest.raises(ValueError, match="does not divide n_heads"):
        cq.simulate_logits(model, tokens, cq.uniform_config(2), 3)
    with pytest.raises(ValueError, match="does not divide"):
        cq.Deployment(d_model=4096, n_heads=30, world_size=4)


def test_quantisation_changes_logits_monotonically(model, tokens):
    base = cq.simulate_logits(model, tokens, cq.uniform_config(2))
    gaps = [(cq.simulate_logits(model, tokens, cq.uniform_config(2, g, c)) - base).abs().mean()
            for g, c in (("w8a8", "c8"), ("w4a8", "c4"))]
    assert 0 < gaps[0] < gaps[1]


def test_real_tensor_parallel_matches_simulation_and_counts_bytes(model, tokens):
    configs = {"fp16": cq.uniform_config(2), "c8": cq.uniform_config(2, "w8a8", "c8"),
               "c4": cq.uniform_config(2, "w4a8", "c4")}
    result = cq.run_tensor_parallel(model, tokens, configs, repeats=1, bench_sizes=[64])
    rows = tokens.numel()
    for name, config in configs.items():
        sim = cq.simulate_logits(model, tokens, config, 2)
        assert (result.logits[name] - sim).abs().max() < 1e-9
        assert result.rank_gap[name] == 0.0
        per_site = cq.payload_bytes(rows, CFG.d_model, config["0.attn_ar"])
        assert result.bytes_sent[name] == [4 * per_site] * 2  # 4 all-reduces, 1 peer
    assert result.bench[0][0] == 64


def test_thread_backend_runs_the_same_rank_code(model, tokens):
    configs = {"fp16": cq.uniform_config(2), "c4": cq.uniform_config(2, "w4a8", "c4")}
    result = cq.run_tensor_parallel(model, tokens, configs, repeats=1, bench_sizes=[64, 128],
                                    backend="threads")
    rows = tokens.numel()
    for name, config in configs.items():
        sim = cq.simulate_logits(model, tokens, config, 2)
        assert (result.logits[name] - sim).abs().max() < 1e-9
        assert result.rank_gap[name] == 0.0
        per_site = cq.payload_bytes(rows, CFG.d_model, config["0.attn_ar"])
        assert result.bytes_sent[name] == [4 * per_site] * 2
    assert [size for size, _ in result.bench] == [64, 128]
    with pytest.raises(RuntimeError, match="failed on purpose"):
        cq.run_tensor_parallel(model, tokens, configs, repeats=1, fail_rank=0, timeout=30,
                               backend="threads")
    with pytest.raises(ValueError, match="backend"):
        cq.run_tensor_parallel(model, tokens, configs, backend="mpi")


def test_failing_worker_is_joined_and_reported(model, tokens):
    with pytest.raises(RuntimeError, match="failed on purpose"):
        cq.run_tensor_parallel(model, tokens, {"fp16": cq.uniform_config(2)}, repeats=1,
                               fail_rank=1, timeout=60)


# --- cost model ----------------------------------------------------------------------------


def test_missing_or_bad_hardware_constant_is_rejected():
    with pytest.raises(ValueError, match="misses the constant 'link_bandwidth'"):
        cq.HardwareProfile("x", 1e12, 2e12, 4e12, 1e12, None, 1e-6, 1e-6)
    with pytest.raises(ValueError, match="positive"):
        cq.HardwareProfile("x", 1e12, 2e12, 4e12, 1e12, -1.0, 1e-6, 1e-6)


def test_roofline_regimes():
    hw = cq.PCIE_A100
    # a huge square GEMM is compute-bound: int8 halves the time
    big = [cq.gemm_time(8192, 8192, 8192, p, hw) - hw.kernel_latency for p in ("w16a16", "w8a8")]
    assert big[1] / big[0] == pytest.approx(0.5, rel=1e-3)
    # a matrix-vector product is memory-bound: 4-bit weights read a quarter of the bytes
    small = [cq.gemm_time(1, 8192, 8192, p, hw) - hw.kernel_latency for p in ("w16a16", "w4a8")]
    assert small[1] / small[0] == pytest.approx(0.25, rel=1e-3)


def test_comm_time_is_latency_plus_bandwidth():
    shape = cq.Deployment(tokens=1024, d_model=1024, d_mlp=4096, n_heads=8, world_size=2)
    hw = cq.NVLINK_A100
    t16 = cq.comm_time(shape, "c16", hw)
    assert t16 == pytest.approx(2 * hw.link_latency + 1024 * 1024 * 2 / hw.link_bandwidth)
    t8 = cq.comm_time(shape, "c8", hw)
    assert t8 == pytest.approx(hw.link_latency + (1024 * 1024 + 1024 * 2) / hw.link_bandwidth)
    # aligned int8 costs no conversion, int4 into an int8 GEMM does
    assert cq.conversion_time(shape, "c8", "w8a8", hw) == 0
    assert cq.conversion_time(shape, "c4", "w8a8", hw) > 0
    assert cq.conversion_time(shape, "c16", None, hw) == 0


# --- ILP ---------------------------------------------------------------------------------------


def random_problem(seed, sites=None):
    rng = np.random.default_rng(seed)
    sens = {}
    for site in cq.site_names(2):
        for option in cq.site_options(site)[1:]:
            sens[site, option] = float(rng.gamma(1.0, 0.01)) * (2 if option[-1] == "4" else 1)
    shape = cq.Deployment(tokens=int(rng.choice([256, 4096])), d_model=2048, d_mlp=8192,
                          n_heads=16, n_layers=2, world_size=2)
    hw = cq.PCIE_A100 if seed % 2 else cq.NVLINK_A100
    return cq.build_problem(sens, shape, hw, sites)


SMALL = ["0.proj", "0.attn_ar", "0.fc_in", "0.fc_out", "0.mlp_ar", "1.qkv"]


@pytest.mark.parametrize("seed", range(6))
def test_milp_equals_brute_force_and_cbc(seed):
    problem = random_problem(seed, SMALL)
    total = sum(problem.sensitivity[s].max() for s in problem.sites)
    for fraction in (0.1, 0.3, 0.6):
        budget = fraction * total
        ours = cq.solve(problem, budget=budget)
        brute = cq.brute_force(problem, budget=budget)
        cbc = cq.solve_pulp(problem, budget=budget)
        assert ours.latency == pytest.approx(brute.latency, rel=1e-9)
        assert cbc.latency == pytest.approx(brute.latency, rel=1e-7)
        assert ours.sensitivity <= budget + 1e-12
    # the dual form: least sensitivity under a latency cap
    fastest = cq.solve(problem, budget=np.inf).latency
    slowest = problem.latency_of({s: problem.options[s][0] for s in problem.sites})
    cap = 0.5 * (fastest + slowest)
    assert cq.solve(problem, latency_cap=cap).sensitivity == pytest.approx(
        cq.brute_force(problem, latency_cap=cap).sensitivity, abs=1e-12)


def test_brute_force_agrees_with_plain_enumeration():
    problem = random_problem(3, ["0.attn_ar", "0.fc_in", "0.fc_out"])
    budget = 0.02
    feasible = [c for c in cq.all_configs(problem) if problem.sensitivity_of(c) <= budget]
    best = min(problem.latency_of(c) for c in feasible)
    assert cq.brute_force(problem, budget=budget).latency == pytest.approx(best)


def test_full_problem_matches_brute_force():
    problem = random_problem(1)
    budget = 0.3 * sum(problem.sensitivity[s].max() for s in problem.sites)
    assert cq.solve(problem, budget=budget).latency == pytest.approx(
        cq.brute_force(problem, budget=budget).latency, rel=1e-9)


def test_infeasible_budget_is_explained():
    problem = random_problem(0, SMALL)
    with pytest.raises(ValueError, match="infeasible: no configuration keeps"):
        cq.solve(problem, budget=-1.0)
    with pytest.raises(ValueError, match="infeasible: no configuration meets the latency cap"):
        cq.solve(problem, latency_cap=1e-9)
    with pytest.raises(ValueError, match="exactly one"):
        cq.solve(problem)


def test_pareto_front():
    points = [(1, 5), (2, 3), (3, 4), (4, 1), (2, 2)]
    assert cq.pareto_front(points) == [0, 4, 3]


def test_relative_sensitivities_sum_to_one_at_the_most_aggressive_options():
    sens = {("0.qkv", "w8a8"): 0.1, ("0.qkv", "w4a4"): 0.3, ("0.attn_ar", "c4"): 0.1}
    rel = cq.relative(sens)
    assert rel["0.qkv", "w4a4"] + rel["0.attn_ar", "c4"] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        cq.additivity_ratio(0.1, 0.0)


# --- the float16 scale clamp, calibration sets, baselines, the aligned ablation -----------------


@pytest.mark.parametrize("amax", [1e-9, 1e-7, 5e-6, 1e-3])
def test_float16_scale_never_underflows(amax):
    x = torch.linspace(-amax, amax, 16, dtype=torch.float64).reshape(2, 8)
    for bits, precision in ((8, "c8"), (4, "c4")):
        codes, scale = cq.quantise_rows(x, bits, scale_dtype=torch.float16)
        assert torch.isfinite(scale).all() and (scale > 0).all()
        assert codes.abs().max() <= 2 ** (bits - 1) - 1
        decoded = cq.decode_partial(cq.encode_partial(x, precision), 2, 8, precision)
        assert torch.isfinite(decoded).all()
        assert ((decoded - x).abs() <= scale / 2 + 1e-15).all()
    if amax < 1e-8:  # without the clamp this row's scale would round to zero in float16
        assert torch.tensor(amax / 127).half().item() == 0.0


def test_quantiser_rejects_non_finite_input():
    with pytest.raises(ValueError, match="NaN or infinite"):
        cq.quantise_rows(torch.tensor([[1.0, float("nan")]]), 8)


def test_expected_loss_matches_sampled_loss_on_average(model):
    from icml26.language import zipf_markov_source

    source = zipf_markov_source(vocab_size=16, order=2, exponent=1.0, temperature=0.5,
                                spread=0.5, seed=3)
    windows = torch.as_tensor(source.sample(600, 9, seed=4))
    config = cq.uniform_config(2)
    sampled = cq.window_nll(model, windows, config, 2, 2)
    expected = cq.window_nll(model, windows, config, 2, 2, source=source)
    assert sampled.shape == expected.shape == (600,)
    assert np.allclose(sampled, cq.batch_nll(model, windows, config, 600, 2, 2))
    gap = sampled - expected
    assert abs(gap.mean()) < 4 * gap.std(ddof=1) / np.sqrt(gap.size)
    assert expected.std() < sampled.std()  # no target-sampling noise
    # by hand for one window: the context of the target after position t is (x_{t-1}, x_t)
    w = windows[:1]
    logp = cq.simulate_logits(model, w[:, :-1], config, 2)[0, 1:].log_softmax(-1)
    rows = torch.as_tensor(source.transition)[[int(w[0, t - 1]) * 16 + int(w[0, t])
                                               for t in range(1, 8)]]
    assert expected[0] == pytest.approx(float(-(rows * logp).sum(-1).mean()), abs=1e-12)
    with pytest.raises(ValueError, match="min_context"):
        cq.window_nll(model, windows, config, 2, 1, source=source)


def test_calibrate_sets_splits_one_run_per_configuration(model, tokens):
    windows = torch.randint(0, 16, (6, 9), generator=torch.Generator().manual_seed(5))
    sens, errors = cq.calibrate_sets(model, [windows[:4], windows[4:]], 2, 0)
    whole = cq.calibrate(model, windows[:4], 2, 0)
    assert set(sens[0]) == set(whole) and len(sens) == len(errors) == 2
    for key, value in whole.items():
        assert sens[0][key] == pytest.approx(value, abs=1e-10)
        assert errors[0][key] >= 0
    floored = cq.floored(sens[0], errors[0])
    assert all(floored[k] >= max(sens[0][k], 0) for k in floored)
    with pytest.raises(ValueError):
        cq.calibrate_sets(model, [windows[:1]], 2, 0)


def test_equal_sensitivities_average_over_sites_of_a_kind():
    sens = {("0.qkv", "w8a8"): 0.1, ("1.qkv", "w8a8"): 0.3, ("0.attn_ar", "c4"): 0.2,
            ("0.mlp_ar", "c4"): 0.0}
    blind = cq.equal_sensitivities(sens)
    assert blind["0.qkv", "w8a8"] == blind["1.qkv", "w8a8"] == pytest.approx(0.2)
    assert blind["0.attn_ar", "c4"] == blind["0.mlp_ar", "c4"] == pytest.approx(0.1)
    jittered = cq.equal_sensitivities(sens, np.random.default_rng(0))
    assert jittered["0.qkv", "w8a8"] != jittered["1.qkv", "w8a8"]
    assert jittered["0.qkv", "w8a8"] == pytest.approx(0.2, rel=1e-3)


def test_blind_ties_are_broken_at_random_by_the_solver():
    # four all-reduces of equal size: with equal costs, which two get int4 messages is a tie
    shape = cq.Deployment(tokens=4096, d_model=4096, d_mlp=16384, n_heads=32, world_size=2)
    sens = {(s, o): (0.0 if cq.site_kind(s) == "comm" else 1.0) + (0.01 if o == "c4" else 0.0)
            for s in cq.site_names(2) for o in cq.site_options(s)[1:]}
    blank = cq.build_problem({}, shape, cq.PCIE_A100)
    base = cq.uniform_config(2, "w16a16", "c8")
    cap = blank.latency_of(dict(base, **{"0.attn_ar": "c4", "1.mlp_ar": "c4"}))
    rng = np.random.default_rng(0)
    chosen = set()
    for _ in range(12):
        blind = cq.build_problem(cq.equal_sensitivities(sens, rng), shape, cq.PCIE_A100)
        config = cq.solve(blind, latency_cap=cap).config
        chosen.add(tuple(s for s, o in config.items() if o == "c4"))
    assert len(chosen) > 1, chosen


def test_random_allocations_stay_within_the_latency_window():
    problem = random_problem(2, SMALL)
    fastest = cq.solve(problem, budget=np.inf).latency
    slowest = problem.latency_of({s: problem.options[s][0] for s in problem.sites})
    cap = 0.5 * (fastest + slowest)
    draws = cq.random_allocations(problem, cap, 50, np.random.default_rng(1), slack=0.1)
    assert all(0.9 * cap <= d.latency <= cap * (1 + 1e-12) for d in draws)
    assert len({tuple(d.config.values()) for d in draws}) > 1
    with pytest.raises(ValueError, match="no configuration"):
        cq.random_allocations(problem, 0.5 * fastest, 1, np.random.default_rng(1))
    with pytest.raises(TypeError):
        cq.random_allocations(problem, cap, 1, rng=1)


def test_without_the_rewrite_every_quantised_message_pays_conversion():
    shape = cq.Deployment(tokens=1024, d_model=1024, d_mlp=4096, n_heads=8, world_size=2)
    hw = cq.PCIE_A100
    assert cq.conversion_time(shape, "c8", "w8a8", hw, aligned=False) > 0
    assert cq.conversion_time(shape, "c16", "w8a8", hw, aligned=False) == 0
    with pytest.raises(TypeError):
        cq.conversion_time(shape, "c8", "w8a8", hw, aligned=1)
    config = cq.uniform_config(2, "w8a8", "c8")
    assert cq.predicted_latency(config, shape, hw, aligned=False) > cq.predicted_latency(
        config, shape, hw)
    sens = {("0.qkv", "w8a8"): 0.01}
    with_rewrite = cq.build_problem(sens, shape, hw)
    without = cq.build_problem(sens, shape, hw, aligned=False)
    assert without.latency_of(config) == pytest.approx(
        cq.predicted_latency(config, shape, hw, aligned=False))
    assert with_rewrite.latency_of(config) == pytest.approx(cq.predicted_latency(config, shape, hw))
    assert cq.solve(without, budget=1.0).latency >= cq.solve(with_rewrite, budget=1.0).latency
