"""Exercise rabit-ex-sequential: RaBiT's sequential residual binarization, from scratch."""

import torch

from icml26 import rabit as rb

OK_FORMAT = False
name = "rabit-ex-sequential"
points = 2


def test_matches_the_layer_for_two_and_three_paths(sequential_binarize):
    generator = torch.Generator().manual_seed(7)
    W = torch.randn(20, 36, generator=generator, dtype=torch.float64) * 0.05
    X = torch.randn(300, 36, generator=generator, dtype=torch.float64)
    for paths in (2, 3):
        init = rb.function_aware_init(W, X, paths)
        layer = rb.ResidualBinaryLinear(W, init, mode="rabit")
        with torch.no_grad():
            layer.latents[0].add_(0.02 * torch.randn(20, 36, generator=generator,
                                                     dtype=torch.float64))
            expected = layer.weight()
            mine = sequential_binarize(layer.latents[0].clone(), init.out_scales,
                                       init.in_scales)
        assert torch.allclose(mine, expected, rtol=0, atol=1e-12), f"P = {paths}"


def test_two_paths_round_to_the_nearest_level(sequential_binarize):
    latent = torch.linspace(-1.0, 1.0, 201, dtype=torch.float64)[None, :] + 1e-3
    out_scales = torch.tensor([[0.5], [0.2]], dtype=torch.float64)
    in_scales = torch.ones(2, 201, dtype=torch.float64)
    levels = torch.tensor([-0.7, -0.3, 0.3, 0.7], dtype=torch.float64)
    nearest = levels[(latent[0, :, None] - levels).abs().argmin(1)]
    result = sequential_binarize(latent, out_scales, in_scales)
    assert torch.allclose(result[0], nearest), "two paths should round to the nearest level"
