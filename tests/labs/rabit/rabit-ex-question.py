"""Exercise rabit-ex-question: the path correlation of an untrained residual fit."""

import torch

from icml26 import rabit as rb

OK_FORMAT = False
name = "rabit-ex-question"
points = 2


def _reference(weight, inputs):
    first, second = rb.residual_svid(weight, 2).path_weights()
    a, b = (inputs @ first.T).flatten(), (inputs @ second.T).flatten()
    a, b = a - a.mean(), b - b.mean()
    return float(a @ b / (a.norm() * b.norm()))


def test_matches_the_definition(residual_correlation, rng):
    seed = int(rng.integers(1_000_000))
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(20, 30, generator=generator, dtype=torch.float64)
    inputs = torch.randn(200, 30, generator=generator, dtype=torch.float64)
    inputs = inputs * torch.linspace(0.2, 2.0, 30, dtype=torch.float64)
    value = float(residual_correlation(weight, inputs))
    assert abs(value - _reference(weight, inputs)) < 1e-8, value


def test_negative_for_a_gaussian_weight(residual_correlation):
    generator = torch.Generator().manual_seed(4)
    weight = torch.randn(48, 64, generator=generator, dtype=torch.float64)
    inputs = torch.randn(300, 64, generator=generator, dtype=torch.float64)
    assert float(residual_correlation(weight, inputs)) < 0
