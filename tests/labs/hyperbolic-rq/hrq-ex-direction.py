"""Exercise hrq-ex-direction: collision rate of residual k-means for several pyramids."""

import torch

import icml26.hyperbolic_rq as hr

OK_FORMAT = False
name = "hrq-ex-direction"
points = 2


def test_matches_fit_codebooks(collision_by_sizes):
    g = torch.Generator().manual_seed(3)
    z = hr.expmap0(torch.randn(300, 4, generator=g, dtype=torch.float64) * 0.6)
    shapes = [(12, 8, 4), (8, 8, 8), (4, 8, 12)]
    for geometry in hr.GEOMETRIES:
        got = collision_by_sizes(z, shapes, geometry, 1.0, 0)
        assert set(got) == set(shapes), "return one entry per size tuple, keyed by the tuple"
        for sizes in shapes:
            books = hr.fit_codebooks(z, sizes, geometry, 1.0, seed=0)
            codes, _ = hr.residual_quantize(z, books, geometry, 1.0)
            assert abs(got[sizes] - hr.collision_rate(codes.numpy())) < 1e-12
