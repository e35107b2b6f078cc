"""Exercise intro-ex-norm: detection rate of random directions by norm."""

import numpy as np

from icml26 import introspection as intro

OK_FORMAT = False
name = "intro-ex-norm"
points = 2


def test_rates_by_norm(random_tpr):
    lang = intro.ConceptLanguage(n_train=2, n_heldout=3, n_baseline=2)
    model = intro.make_model(lang, n_layers=2, d_model=32, d_mlp=64, seed=5)
    rates = np.asarray(random_tpr(model, lang, 1, lang.heldout_concepts, [0.0, 0.5, 50.0],
                                  trials=4, seed=2), dtype=float)
    assert rates.shape == (3,)
    assert np.all((rates >= 0) & (rates <= 1))
    prompts, _ = intro.trial_batch(lang, lang.heldout_concepts, 4, np.random.default_rng(2))
    _, yes, _ = intro.detect(model, lang, prompts)
    assert rates[0] == float(yes.float().mean()), "at scale 0 the rate is the FPR on the prompts"
