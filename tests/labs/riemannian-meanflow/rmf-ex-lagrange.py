"""Exercise rmf-ex-lagrange: the Lagrangian identity on the analytic rotation flow."""

import torch

import icml26.riemannian_meanflow as rm

OK_FORMAT = False
name = "rmf-ex-lagrange"
points = 2


def test_residual_is_at_rounding_level(lagrangian_residual):
    flow = rm.RotationFlow(torch.tensor([-0.4, 0.9, 0.2], dtype=torch.float64))
    g = torch.Generator().manual_seed(3)
    x = rm.uniform_sphere(80, seed=9)
    s = 0.4 * torch.rand(80, dtype=torch.float64, generator=g)
    t = s + 0.1 + 0.5 * torch.rand(80, dtype=torch.float64, generator=g)
    assert lagrangian_residual(flow, x, s, t) < 1e-9
