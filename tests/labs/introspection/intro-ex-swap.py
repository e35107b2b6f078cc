"""Exercise intro-ex-swap: swapping the coordinate along one direction."""

import torch

from icml26 import introspection as intro

OK_FORMAT = False
name = "intro-ex-swap"
points = 2


def test_swap_sets_the_coordinate(swap_direction):
    torch.manual_seed(3)
    d = torch.randn(12)
    x = torch.randn(4, 5, 12)
    y = swap_direction(x, d, 0.7)
    unit = d / d.norm()
    assert torch.allclose(y @ unit, torch.full((4, 5), 0.7), atol=1e-5)
    assert torch.allclose(y - (y @ unit)[..., None] * unit, x - (x @ unit)[..., None] * unit,
                          atol=1e-5)


def test_swap_equals_mean_ablation(swap_direction):
    torch.manual_seed(4)
    d, mu, x = torch.randn(8), torch.randn(8), torch.randn(6, 8)
    unit = d / d.norm()
    assert torch.allclose(swap_direction(x, d, float(mu @ unit)), intro.mean_ablate(d, mu)(x),
                          atol=1e-5)
