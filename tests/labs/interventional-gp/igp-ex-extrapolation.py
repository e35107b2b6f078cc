"""Exercise igp-ex-extrapolation: the posterior outside the support of A."""

import numpy as np
import torch

from icml26 import interventional_gp as igp

OK_FORMAT = False
name = "igp-ex-extrapolation"
points = 3


def _problem():
    data = igp.mediator_chain(60, 2, 0.5, seed=12).observed()
    outcome = igp.GPStage(igp.GaussianKernel(torch.tensor([0.8, 1.1]), 0.9), 0.15)
    treatment = igp.GPStage(igp.GaussianKernel(torch.tensor([0.1]), 0.7), 0.05)
    return igp, data, outcome, treatment


def test_far_limit_by_hand(far_limit):
    igp, data, outcome, treatment = _problem()
    for scale in (0.25, 1.0, 4.0):
        far = igp.ImpspecPosterior(data, outcome, treatment, igp.Intervention(np.array([[50.0]])))
        expected = far.variance(scale).item()
        got = float(far_limit(data, outcome, treatment, scale))
        assert abs(got - expected) <= 1e-8 * expected, f"scale {scale}: {got} vs {expected}"


def test_profile_reverts_to_the_prior_mean(extrapolation_profile):
    igp, data, outcome, treatment = _problem()
    grid = np.array([[-3.0], [0.2], [0.5], [0.8], [4.0]])
    mean, sd = (np.asarray(x, float).reshape(-1)
                for x in extrapolation_profile(data, outcome, treatment, grid, 1.0))
    post = igp.ImpspecPosterior(data, outcome, treatment, igp.Intervention(grid))
    assert np.allclose(mean, post.mean.numpy(), atol=1e-10)
    assert np.allclose(sd, post.variance(1.0).sqrt().numpy(), atol=1e-10)
    assert abs(mean[0]) < 1e-6 and abs(mean[-1]) < 1e-6, "far from the data the mean is 0"
    assert sd[0] > sd[1:4].max() and sd[-1] > sd[1:4].max(), "and the band widens"
