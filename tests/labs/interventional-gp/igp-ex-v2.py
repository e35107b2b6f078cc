"""Exercise igp-ex-v2: the second variance term by Monte Carlo over the measure."""

import torch

from icml26 import interventional_gp as igp

OK_FORMAT = False
name = "igp-ex-v2"
points = 2


def _problem():
    chain = igp.mediator_chain(60, 2, 0.5, seed=11)
    outcome = igp.GPStage(igp.GaussianKernel(torch.tensor([0.8, 1.1]), 0.9), 0.15)
    return igp, torch, chain.observed(), outcome


def test_matches_the_closed_form(posterior_spread_mc):
    igp, torch, data, outcome = _problem()
    for scale in (0.5, 2.0):
        measure = igp.data_measure(data.V1, scale)
        R = igp.integral_operator_gram(outcome.kernel, measure, data.V1)
        K = outcome.kernel.gram(data.V1) + outcome.noise * torch.eye(len(data.V1),
                                                                       dtype=torch.float64)
        closed = outcome.kernel.outputscale - torch.trace(torch.linalg.solve(K, R)).item()
        estimate = float(posterior_spread_mc(data.V1, data.Y, outcome, measure, 40_000, seed=1))
        assert abs(estimate - closed) < 0.03 * closed, f"scale {scale}: {estimate} vs {closed}"
        assert estimate < outcome.kernel.outputscale, "the posterior spread is below the prior's"


def test_depends_on_the_seed_only_through_noise(posterior_spread_mc):
    igp, _, data, outcome = _problem()
    measure = igp.data_measure(data.V1, 1.0)
    first = float(posterior_spread_mc(data.V1, data.Y, outcome, measure, 20_000, seed=2))
    again = float(posterior_spread_mc(data.V1, data.Y, outcome, measure, 20_000, seed=2))
    other = float(posterior_spread_mc(data.V1, data.Y, outcome, measure, 20_000, seed=3))
    assert first == again, "the same seed must give the same estimate"
    assert first != other and abs(first - other) < 0.05 * first
