"""Exercise lts-ex-index: the mixed-radix index of an FSQ code."""

import torch
import vector_quantize_pytorch as vqp

OK_FORMAT = False
name = "lts-ex-index"
points = 1


def test_matches_library_indices(fsq_index):
    for levels in [(8, 5, 5), (5, 5, 7), (8, 6)]:
        lib = vqp.FSQ(levels=list(levels))
        size = 1
        for level in levels:
            size *= level
        codes = lib.indices_to_codes(torch.arange(size))
        assert torch.equal(torch.as_tensor(fsq_index(codes, levels)).long(), torch.arange(size))
