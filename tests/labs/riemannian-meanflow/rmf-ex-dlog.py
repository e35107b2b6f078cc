"""Exercise rmf-ex-dlog: the curvature term of the Eulerian identity in closed form."""

import math

import torch
from torch.func import jvp

import icml26.riemannian_meanflow as rm

OK_FORMAT = False
name = "rmf-ex-dlog"
points = 2


def test_matches_forward_mode(dlog_by_hand):
    x, y = rm.uniform_sphere(100, seed=5), rm.uniform_sphere(100, seed=6)
    keep = (x * y).sum(-1) > -0.9
    x, y = x[keep], y[keep]
    v = rm.proju(x, torch.randn(x.shape, dtype=torch.float64,
                                generator=torch.Generator().manual_seed(7)))
    _, d = jvp(lambda z: rm.logmap(z, y), (x,), (v,))
    assert torch.allclose(dlog_by_hand(x, y, v), -rm.proju(x, d), atol=1e-8)


def test_short_distance_factor(dlog_by_hand):
    theta = 0.2
    x = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    y = torch.tensor([[math.sin(theta), 0.0, math.cos(theta)]], dtype=torch.float64)
    along = dlog_by_hand(x, y, torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64))
    across = dlog_by_hand(x, y, torch.tensor([[0.0, 1.0, 0.0]], dtype=torch.float64))
    assert abs(float(along[0, 0]) - 1) < 1e-12
    assert abs(float(across[0, 1]) - theta / math.tan(theta)) < 1e-12
