"""Exercise hrq-ex-scalar: Möbius scalar multiplication against geoopt."""

import geoopt
import torch

import icml26.hyperbolic_rq as hr

OK_FORMAT = False
name = "hrq-ex-scalar"
points = 1


def test_matches_geoopt_and_scales_distance(mobius_scalar):
    g = torch.Generator().manual_seed(5)
    c = 0.7
    x = torch.randn(100, 4, generator=g, dtype=torch.float64)
    x = x / x.norm(dim=-1, keepdim=True) * torch.rand(100, 1, generator=g, dtype=torch.float64)
    x = x * 0.9 / c**0.5
    ball = geoopt.PoincareBall(c=torch.tensor(c, dtype=torch.float64))
    zero = torch.zeros_like(x)
    for r in (0.5, 1.7, -2.0):
        ours = mobius_scalar(r, x, c)
        assert torch.allclose(ours, ball.mobius_scalar_mul(torch.tensor(r, dtype=torch.float64), x),
                              atol=1e-9)
        assert torch.allclose(hr.dist(zero, ours, c), abs(r) * hr.dist(zero, x, c), atol=1e-7)
