"""Exercise hps-ex-matrix: gradient agreement with whole matrices as the granularity."""

import numpy as np
import torch

OK_FORMAT = False
name = "hps-ex-matrix"
points = 2


def test_matrix_agreement_against_a_loop(matrix_agreement):
    gen = torch.Generator().manual_seed(11)
    w, g = torch.randn(3, 4, 5, generator=gen), torch.randn(4, 3, 4, 5, generator=gen)
    tan, rad = matrix_agreement(w, g)
    tan, rad = np.asarray(tan), np.asarray(rad)
    assert tan.shape == (3,) and rad.shape == (3,)
    for s in range(3):
        u = w[s].flatten() / w[s].norm()
        parts = []
        for k in range(4):
            gk = g[k, s].flatten()
            parts.append((float(u @ gk), gk - (u @ gk) * u))
        pairs = [(a, b) for a in range(4) for b in range(a + 1, 4)]
        tan_loop = np.mean([float(torch.nn.functional.cosine_similarity(
            parts[a][1], parts[b][1], dim=0)) for a, b in pairs])
        rad_loop = np.mean([np.sign(parts[a][0] * parts[b][0]) for a, b in pairs])
        assert abs(tan[s] - tan_loop) < 1e-5
        assert abs(rad[s] - rad_loop) < 1e-6
    same_tan, same_rad = matrix_agreement(w, g[:1].expand(4, -1, -1, -1))
    assert np.allclose(same_tan, 1, atol=1e-5) and np.allclose(same_rad, 1)
