"""Exercise rabit-ex-skips: skipped quantization levels under independent and RaBiT training."""

import torch

from icml26 import rabit as rb

OK_FORMAT = False
name = "rabit-ex-skips"
points = 3


def test_level_skip_rate_on_hand_made_transitions(level_skip_rate):
    def paths(first, second):
        signs = torch.tensor([first, second], dtype=torch.float64)[:, None, :]
        return rb.BinaryPaths(signs, torch.ones(2, 1, dtype=torch.float64),
                              torch.ones(2, len(first), dtype=torch.float64))

    # levels before: 0, 1, 2, 3, 1 ; after: 1 (+1), 3 (+2), 2 (0), 0 (-3), 2 (+1)
    before = paths([-1, -1, 1, 1, -1], [-1, 1, -1, 1, 1])
    after = paths([-1, 1, 1, -1, 1], [1, 1, -1, -1, -1])
    assert abs(level_skip_rate(before, after) - 0.5) < 1e-12
    assert level_skip_rate(before, before) == 0.0


def test_independent_paths_skip_levels_and_rabit_does_not(skip_rate):
    independent = skip_rate("independent", 10, 3e-3, 1)
    rabit = skip_rate("rabit", 10, 3e-3, 1)
    assert 0.0 <= rabit < 0.02, f"RaBiT should (almost) never skip a level, got {rabit}"
    assert independent > 0.2, f"independent paths should often skip levels, got {independent}"
