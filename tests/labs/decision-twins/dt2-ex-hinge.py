"""Exercise dt2-ex-hinge: a pairwise hinge ranking loss."""

import numpy as np
import torch

OK_FORMAT = False
name = "dt2-ex-hinge"
points = 2


def test_matches_a_loop_and_vanishes_when_separated(hinge_ranking_loss, submission):
    gen = torch.Generator().manual_seed(3)
    pred, ref = torch.randn(3, 6, generator=gen), torch.randn(3, 6, generator=gen)
    ours = hinge_ranking_loss(pred, ref, 0.3)
    assert tuple(ours.shape) == (3,)
    for m in range(3):
        loop = [max(0.0, 0.3 - float(pred[m, i] - pred[m, j]))
                for i in range(6) for j in range(6) if ref[m, i] > ref[m, j]]
        assert abs(float(ours[m]) - np.mean(loop)) < 1e-5
    loss, grad = submission.evaluate(
        "separated = ref.argsort().argsort().float().requires_grad_(True)  # gaps >= 1\n"
        "loss = hinge_ranking_loss(separated, ref, 0.3).sum()\n"
        "loss.backward()\n"
        "float(loss), separated.grad", ref=ref)
    assert loss == 0.0
    assert grad is not None, "the loss should be differentiable in the predictions"
    assert float(grad.abs().max()) == 0.0
