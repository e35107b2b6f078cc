"""Exercise lts-ex-suffix: decoding from the last tokens of an ordered tokenizer."""

import torch

from icml26 import latent_token_search as lts

OK_FORMAT = False
name = "lts-ex-suffix"
points = 2


def test_suffix_agrees_at_full_length_and_is_worse_at_two(suffix_mse):
    tok, _, x, v = lts.quick_tokenizer(n=2000, steps=300, seed=2)
    full = float(tok.prefix_mse(x, v, tok.n_tokens).mean())
    assert abs(suffix_mse(tok, x, v, tok.n_tokens) - full) < 1e-4
    assert suffix_mse(tok, x, v, 2) > float(tok.prefix_mse(x, v, 2).mean())
    # by hand: the last two tokens kept, the others masked
    with torch.no_grad():
        codes = tok.encode(x[:5], v[:5])
        codes[:, :-2] = tok.mask[:-2]
        out = tok.decoder(torch.cat([codes.reshape(5, -1), tok.norm.context(v[:5])], -1))
        by_hand = float(((lts.rollout(out.reshape(5, -1, 2), v[:5]) - x[:5]) ** 2).mean())
    assert abs(suffix_mse(tok, x[:5], v[:5], 2) - by_hand) < 1e-4
