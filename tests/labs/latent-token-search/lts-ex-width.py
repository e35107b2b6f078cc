"""Exercise lts-ex-width: beam search at several widths."""

import numpy as np

from icml26 import latent_token_search as lts

OK_FORMAT = False
name = "lts-ex-width"
points = 2


def test_sweep_matches_beam_search(beam_width_sweep, PRIOR_WEIGHT):
    tok, prior, _, _ = lts.quick_tokenizer(n=1000, steps=60, seed=1)
    scenarios = lts.make_scenarios(2, np.random.default_rng(7))
    out = beam_width_sweep(tok, prior, scenarios, [1, 2])
    assert len(out) == 2
    for width, value in zip([1, 2], out, strict=True):
        budget = lts.beam_cost(tok.n_tokens, tok.fsq.codebook_size, width)
        direct = np.mean([lts.beam_search(tok, s, budget, prior, PRIOR_WEIGHT).cost
                          for s in scenarios])
        assert abs(value - direct) < 1e-5 * max(1.0, abs(direct))
