"""Exercise umem-ex-code-reward: the released per-neighbour gain."""

import itertools

from icml26.umem import marginal_utility

OK_FORMAT = False
name = "umem-ex-code-reward"
points = 2


def test_code_gain_matches_the_library(code_gain):
    for c_mem, c_ref in itertools.product((0, 1), repeat=2):
        for len_mem, len_ref in ((40.0, 100.0), (100.0, 100.0), (130.0, 100.0)):
            ours = float(code_gain(c_mem, c_ref, len_mem, len_ref))
            assert ours == float(marginal_utility(c_mem, c_ref, len_mem, len_ref, kind="code"))
            assert ours >= 0, "the released reward is never negative"
