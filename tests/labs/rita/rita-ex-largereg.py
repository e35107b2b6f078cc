"""Exercise rita-ex-largereg: the large-regularisation limit of the OT distance."""

import torch

from icml26 import rita

OK_FORMAT = False
name = "rita-ex-largereg"
points = 2


def test_matches_ot_at_large_lambda(mean_cost_prediction):
    gen = torch.Generator().manual_seed(11)
    z = torch.nn.functional.normalize(torch.randn(40, 6, 5, generator=gen), dim=-1)
    text = torch.nn.functional.normalize(torch.randn(4, 3, 5, generator=gen), dim=-1)
    ours = mean_cost_prediction(z, text)
    assert tuple(ours.shape) == (40,)
    limit = rita.ot_distances(z, text, reg=100.0, n_iter=50).argmin(-1)
    assert float((ours == limit).double().mean()) >= 0.95
    # a second draw with only two views per image
    z2 = torch.nn.functional.normalize(torch.randn(40, 2, 5, generator=gen), dim=-1)
    limit2 = rita.ot_distances(z2, text, reg=100.0, n_iter=50).argmin(-1)
    assert float((mean_cost_prediction(z2, text) == limit2).double().mean()) >= 0.95
