"""Exercise pm-ex-oracle: routing each token to the experts that best fill the dense gap."""

import numpy as np
import torch

import icml26.prism_moe as pm

OK_FORMAT = False
name = "pm-ex-oracle"
points = 2


def test_oracle_expert_minimises_the_remaining_error(oracle_topk):
    model = pm.VARLite(d_model=16, d_mlp=32, n_heads=2, seed=3)
    perm = np.random.default_rng(0).permutation(32)
    layer = pm.MoEMLP(model.blocks[0].mlp, perm[:8], perm[8:].reshape(6, 4), top_k=2,
                      router_weight=torch.randn(6, 16))
    x = torch.randn(50, 16)
    best = oracle_topk(layer, x, 1)
    with torch.no_grad():
        g = layer.dense_output(x) - layer.shared_output(x) - layer.b2
        errors = ((g.unsqueeze(1) - layer.expert_outputs(x)) ** 2).sum(-1)
    assert torch.equal(best.reshape(-1), errors.argmin(1))
    top3 = oracle_topk(layer, x, 3)
    assert top3.shape == (50, 3)
    assert torch.equal(top3[:, 0], errors.argmin(1))
