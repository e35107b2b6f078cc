"""Exercise rmf-ex-kernel: the geodesic Gaussian kernel is not positive definite on S^2."""

import numpy as np
import torch

import icml26.riemannian_meanflow as rm

OK_FORMAT = False
name = "rmf-ex-kernel"
points = 1


def test_smallest_eigenvalue(geodesic_gaussian_min_eig):
    pts = rm.uniform_sphere(300, seed=2)
    d = torch.arccos((pts @ pts.T).clamp(-1, 1)).numpy()
    for h in (0.3, 1.5):
        expected = np.linalg.eigvalsh(np.exp(-d**2 / (2 * h**2))).min()
        assert abs(geodesic_gaussian_min_eig(pts, h) - expected) < 1e-8
    assert geodesic_gaussian_min_eig(pts, 1.5) < -1e-2
