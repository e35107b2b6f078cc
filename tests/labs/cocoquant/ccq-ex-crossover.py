"""Exercise ccq-ex-crossover: the link bandwidth at which communication equals computation."""

from icml26 import cocoquant as cq

OK_FORMAT = False
name = "ccq-ex-crossover"
points = 2


def test_matches_the_cost_model(crossover_bandwidth):
    big = cq.Deployment(tokens=2**16, d_model=2048, d_mlp=8192, n_heads=16, n_layers=1)
    for bits, option in ((16, "c16"), (8, "c8"), (4, "c4")):
        beta = crossover_bandwidth(312e12, 2048, 2, bits)
        hw = cq.HardwareProfile("x", 312e12, 624e12, 1248e12, 2e12, beta, 1e-12, 1e-12)
        parts = cq.latency_breakdown(cq.uniform_config(1, comm=option), big, hw)
        assert abs(parts["communication"] / parts["GEMM"] - 1) < 0.01, bits


def test_scales_with_the_arithmetic_and_the_width(crossover_bandwidth):
    base = crossover_bandwidth(1e12, 1024, 2)
    assert abs(crossover_bandwidth(2e12, 1024, 2) / base - 2) < 1e-12
    assert abs(crossover_bandwidth(1e12, 2048, 2) / base - 0.5) < 1e-12
