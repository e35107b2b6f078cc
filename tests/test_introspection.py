"""Tests of icml26.introspection: vectors, injection hooks, DLA, monotonicity, bad input."""

import numpy as np
import pytest
import torch
from scipy import stats

from icml26 import introspection as intro
from icml26 import nn as tnn


@pytest.fixture(scope="module")
def setup():
    lang = intro.ConceptLanguage(n_train=4, n_heldout=3, n_baseline=3)
    model = intro.make_model(lang, n_layers=3, d_model=32, d_mlp=64, seed=1).eval()
    return lang, model


def test_vocabulary_is_disjoint(setup):
    lang, _ = setup
    ids = ([lang.word(w) for w in intro.FUNCTION_WORDS]
           + [lang.concept_token(c) for c in range(lang.n_concepts)])
    assert len(set(ids)) == len(ids)
    assert max(lang.description(lang.n_concepts - 1)) < lang.vocab_size
    q = lang.questions(5, np.random.default_rng(0))
    assert q.shape == (5, intro.PROMPT_LENGTH) and int(q.max()) < lang.vocab_size


def test_concept_vector_is_a_mean_difference(setup):
    lang, model = setup
    tokens = lang.description_prompt(list(range(lang.n_concepts)))
    states = tnn.hidden_states(model, tokens)  # (L + 1, batch, time, d)
    h = states[2, :, -1]  # output of block 1
    base = h[lang.baseline_concepts].mean(0)
    for c in (0, 5):
        assert torch.allclose(intro.concept_vector(model, lang, c, 1), h[c] - base, atol=1e-5)
    # the baseline mean of the baseline concepts' own vectors is zero by construction
    vecs = intro.concept_vectors(model, lang, lang.baseline_concepts, 1)
    assert torch.allclose(vecs.mean(0), torch.zeros(32), atol=1e-5)


def test_injection_adds_exactly_from_start(setup):
    lang, model = setup
    prompts = lang.questions(3, np.random.default_rng(1))
    v = torch.randn(32)
    name = intro.resid_name(0)
    _, clean = tnn.run_with_cache(model, prompts, [name])
    with intro.inject(model, 0, v, 2.5, start=4):
        _, steered = tnn.run_with_cache(model, prompts, [name])
    diff = steered[name] - clean[name]
    assert torch.allclose(diff[:, :4], torch.zeros_like(diff[:, :4]))
    assert torch.allclose(diff[:, 4:], (2.5 * v).expand_as(diff[:, 4:]), atol=1e-5)


def test_hooks_are_removed_even_on_error(setup):
    lang, model = setup
    prompts = lang.questions(2, np.random.default_rng(2))
    before = model(prompts)
    with pytest.raises(RuntimeError), intro.inject(model, 1, torch.ones(32), 3.0):
        raise RuntimeError("cell failed")
    with pytest.raises(RuntimeError), intro.set_neurons(model, 1, [0, 1], 0.0):
        raise RuntimeError("cell failed")
    assert all(not m._forward_hooks for m in model.modules())
    assert torch.allclose(model(prompts), before)


def test_zero_strength_changes_nothing(setup):
    lang, model = setup
    prompts = lang.questions(4, np.random.default_rng(3))
    m0, yes0, id0 = intro.detect(model, lang, prompts)
    with intro.inject(model, 1, torch.randn(32), 0.0):
        m1, yes1, id1 = intro.detect(model, lang, prompts)
    assert torch.allclose(m0, m1) and torch.equal(yes0, yes1) and torch.equal(id0, id1)


def test_bad_input(setup):
    lang, model = setup
    with pytest.raises(ValueError, match="outside the model"):
        intro.check_layer(model, 3)
    with pytest.raises(ValueError, match="outside the model"):
        intro.concept_vector(model, lang, 0, -1)
    with pytest.raises(TypeError):
        intro.check_layer(model, 1.5)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite"), \
                intro.inject(model, 0, torch.zeros(32), bad):
            pass
    with pytest.raises(ValueError, match="vocabulary"):
        lang.concept_token(lang.n_concepts)
    with pytest.raises(TypeError):
        lang.concept_token("c1")
    with pytest.raises(ValueError):
        intro.mean_ablate(torch.zeros(32), torch.zeros(32))
    with pytest.raises(ValueError):
        intro.mlp_bias(model, torch.zeros(2, 32)).__enter__()
    assert all(not m._forward_hooks for m in model.modules())


def test_dla_matches_frozen_layernorm_difference(setup):
    lang, model = setup
    resid = torch.randn(32)
    acts = torch.rand(64)
    dla = intro.neuron_dla(model, lang, 1, resid, acts)
    ln = model.ln_f
    sigma = torch.sqrt(resid.var(unbiased=False) + ln.eps)

    def margin(x):
        out = model.lm_head(ln.weight * (x - x.mean()) / sigma + ln.bias)
        return out[lang.word("Yes")] - out[lang.word("No")]

    w = model.blocks[1].mlp.fc_out.weight
    with torch.no_grad():
        direct = torch.stack([margin(resid) - margin(resid - acts[j] * w[:, j]) for j in range(64)])
    assert torch.allclose(direct, dla, atol=1e-5)


def test_monotonicity_matches_scipy():
    rng = np.random.default_rng(4)
    alphas = [0.0, 0.5, 1.0, 2.0, 4.0]
    acts = rng.normal(size=(5, 7))
    acts[:, 0] = np.arange(5) ** 2  # perfectly monotone
    acts[:, 1] = 1.0  # constant: defined as 0
    r = intro.monotonicity(alphas, acts)
    assert r[0] == pytest.approx(1.0) and r[1] == 0.0
    for j in range(2, 7):
        assert r[j] == pytest.approx(stats.spearmanr(alphas, acts[:, j])[0])


def test_mean_ablate_properties():
    torch.manual_seed(0)
    d, mu = torch.randn(16), torch.randn(16)
    edit = intro.mean_ablate(d, mu)
    x = torch.randn(10, 16)
    y = edit(x)
    unit = d / d.norm()
    assert torch.allclose(y @ unit, (mu @ unit).expand(10), atol=1e-5)
    orth = x - (x @ unit)[:, None] * unit
    assert torch.allclose(y - (y @ unit)[:, None] * unit, orth, atol=1e-5)
    assert torch.allclose(edit(y), y, atol=1e-5)


def test_norm_matched_random_and_rates():
    g = torch.Generator().manual_seed(0)
    v = torch.randn(6, 8) * torch.arange(1, 7)[:, None]
    r = intro.norm_matched_random(v, g)
    assert torch.allclose(r.norm(dim=1), v.norm(dim=1), atol=1e-5)
    assert intro.rates(torch.tensor([True, False, True])) == (2, 3)
    assert intro.jaccard({1, 2}, {2, 3}) == pytest.approx(1 / 3)
    assert intro.jaccard(set(), set()) == 1


def test_bias_training_freezes_weights(setup):
    lang, model = setup
    layers = [0]
    vecs = intro.vector_table(model, lang, lang.train_concepts + lang.heldout_concepts, layers)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    biases = intro.train_bias(model, lang, vecs, layer=0, alpha=1.0, steps=3, batch=8)
    assert biases.shape == (3, 32) and biases.abs().sum() > 0
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
    assert all(p.requires_grad for p in model.parameters())


def test_pretrain_matches_library_trainer():
    lang = intro.ConceptLanguage(n_train=2, n_heldout=2, n_baseline=2)
    ours = intro.make_model(lang, n_layers=2, d_model=32, d_mlp=64, seed=3)
    ref = intro.make_model(lang, n_layers=2, d_model=32, d_mlp=64, seed=3)
    losses = intro.pretrain(ours, lang, steps=12, seed=4, rows=16)
    corpus = lang.corpus(16, 48, np.random.default_rng(4))
    ref_losses = tnn.train(ref, corpus, steps=12, batch_size=32, lr=3e-3, seed=4).losses
    assert np.allclose(losses, ref_losses, atol=1e-5)
    for a, b in zip(ours.parameters(), ref.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    assert losses[-1] < losses[0]


def test_set_neurons_checks_indices_and_edits_only_them(setup):
    lang, model = setup
    prompts = lang.questions(3, np.random.default_rng(6))
    name = "blocks.1.mlp.hook_post"
    with pytest.raises(ValueError, match="neurons"):
        intro.set_neurons(model, 1, [64], 0.0).__enter__()
    with pytest.raises(ValueError, match="steps"):
        intro.train_bias(model, lang, {0: {}}, layer=0, alpha=1.0, steps=0)
    _, clean = tnn.run_with_cache(model, prompts, [name])
    with intro.set_neurons(model, 1, [2, 5], 0.25):
        _, edited = tnn.run_with_cache(model, prompts, [name])
    keep = [j for j in range(64) if j not in (2, 5)]
    assert torch.allclose(edited[name][..., [2, 5]], torch.full((3, intro.PROMPT_LENGTH, 2), 0.25))
    assert torch.allclose(edited[name][..., keep], clean[name][..., keep])
    assert all(not m._forward_hooks for m in model.modules())


def test_ablation_shares_match_one_set_at_a_time(setup):
    lang, model = setup
    prompts = lang.questions(5, np.random.default_rng(7))
    sets = [[], [1, 4, 9], [0, 2]]
    shares = intro.ablation_shares(model, lang, 1, sets, prompts, chunk=4)
    base, _, _ = intro.detect(model, lang, prompts)
    assert shares[0] == pytest.approx(0.0, abs=1e-6)
    for neurons, share in zip(sets[1:], shares[1:], strict=True):
        with intro.set_neurons(model, 1, neurons, 0.0):
            margin, _, _ = intro.detect(model, lang, prompts)
        expected = float((margin.mean() - base.mean()) / base.mean().abs())
        assert share == pytest.approx(expected, rel=1e-4, abs=1e-6)
    with pytest.raises(ValueError, match="neurons"):
        intro.ablation_shares(model, lang, 1, [[64]], prompts)


def test_mlp_patching_is_zero_up_to_the_injection_layer(setup):
    lang, model = setup
    prompts = lang.questions(6, np.random.default_rng(8))
    vec = torch.randn(32, generator=torch.Generator().manual_seed(0))
    shares = intro.mlp_patching(model, lang, prompts, vec, 0, 3.0)
    assert shares.shape == (3,) and abs(shares[0]) < 1e-5
    assert np.isfinite(shares).all()
    assert all(not m._forward_hooks for m in model.modules())


def test_chat_detection_rejects_bad_trials():
    with pytest.raises(ValueError, match="two-digit"):
        intro.chat_detection_log_odds(None, [5])
    with pytest.raises(ValueError):
        intro.chat_detection_logprobs(None, [100])
    with pytest.raises(ValueError, match="baseline"):
        intro.chat_concept_vectors(None, ["bread"], [], 3)


# --- the transfer toy -------------------------------------------------------------------------


def test_anomaly_batch_marks_exactly_the_off_concept_rows(setup):
    lang, _ = setup
    tokens, odd = intro.anomaly_batch(lang, lang.train_concepts, 200, np.random.default_rng(0),
                                      foreign=lang.heldout_concepts)
    assert tokens.shape == (200, intro.ANOMALY_LENGTH) and 0 < int(odd.sum()) < 200
    clean = intro.clean_descriptions(lang, range(lang.n_concepts))
    for row, is_odd in zip(tokens, odd, strict=True):
        concept = int(row[2]) - lang.concept0
        attrs = row[intro.ATTRIBUTE_START:intro.ATTRIBUTE_START + intro.ATTRIBUTES]
        owners = (attrs - lang.attribute0) // intro.ATTRIBUTES
        foreign = owners[owners != concept]
        assert len(foreign) == int(is_odd)
        assert all(int(f) in lang.heldout_concepts for f in foreign)
        if not is_odd:
            assert torch.equal(row, clean[concept])
    with pytest.raises(ValueError):
        intro.anomaly_batch(lang, [0], 4, np.random.default_rng(0))


def test_preference_loss_sft_and_dpo():
    gen = torch.Generator().manual_seed(0)
    logits, ref = torch.randn(5, 7, generator=gen), torch.randn(5, 7, generator=gen)
    chosen, rejected = torch.tensor([0, 1, 2, 3, 4]), torch.tensor([1, 2, 3, 4, 5])
    sft = intro.preference_loss(logits, ref, chosen, rejected, "sft")
    assert torch.allclose(sft, torch.nn.functional.cross_entropy(logits, chosen,
                                                                 reduction="none"))
    lp, lr_ = logits.log_softmax(-1), ref.log_softmax(-1)
    rows = torch.arange(5)
    z = 0.5 * ((lp[rows, chosen] - lr_[rows, chosen]) - (lp[rows, rejected] - lr_[rows, rejected]))
    dpo = intro.preference_loss(logits, ref, chosen, rejected, "dpo", beta=0.5)
    assert torch.allclose(dpo, -torch.nn.functional.logsigmoid(z))
    # at the reference the DPO loss is log 2
    at_ref = intro.preference_loss(ref, ref, chosen, rejected, "dpo")
    assert torch.allclose(at_ref, torch.full((5,), float(np.log(2))))
    with pytest.raises(ValueError):
        intro.preference_loss(logits, ref, chosen, rejected, "ppo")


def test_stacked_replicates_train_independently(setup):
    lang, model = setup
    one = tnn.stack_models([model])
    two = tnn.stack_models([model, model])
    assert torch.equal(tnn.unstack(model, two, 1).tok_emb.weight, model.tok_emb.weight)
    a, losses_a = intro.post_train_anomalies(lang, model, one, "sft", steps=3, seed=5, batch=4)
    b, losses_b = intro.post_train_anomalies(lang, model, two, "sft", steps=3, seed=5, batch=4)
    # replicate 0 draws the same pairs alone or in a stack, and its update ignores replicate 1
    assert losses_b.shape == (3, 2)
    assert torch.allclose(losses_a[:, 0], losses_b[:, 0], atol=1e-5)
    for name in a:
        assert torch.allclose(a[name][0], b[name][0], atol=1e-5)
    # DPO from the SFT replicates as reference starts at log 2
    _, losses_d = intro.post_train_anomalies(lang, model, a, "dpo", steps=1, seed=5, batch=4)
    assert abs(float(losses_d[0, 0]) - np.log(2)) < 1e-5
    with pytest.raises(ValueError):
        intro.post_train_anomalies(lang, model, one, "ppo", steps=1)


def test_transfer_margins_without_injection_agree(setup):
    lang, model = setup
    out = intro.transfer_margins(model, lang, lang.train_concepts, 1, 0.0,
                                 torch.Generator().manual_seed(0))
    for key in ("other", "random", "own"):
        assert np.allclose(out[key], out["none"], atol=1e-5)
    out = intro.transfer_margins(model, lang, lang.train_concepts, 1, 4.0,
                                 torch.Generator().manual_seed(0))
    assert out["other"].shape == (len(lang.train_concepts),)
    assert not np.allclose(out["other"], out["none"])
    with pytest.raises(ValueError):
        intro.transfer_margins(model, lang, [0], 1, 1.0, torch.Generator())


def test_two_arms_on_the_same_pair_stream(setup):
    lang, model = setup
    two = tnn.stack_models([model, model])
    # both replicates read stream 0 with the same method: they stay identical
    same, _ = intro.post_train_anomalies(lang, model, two, ["sft", "sft"], steps=2, seed=3,
                                         batch=4, streams=[0, 0])
    assert all(torch.allclose(p[0], p[1]) for p in same.values())
    arms, _ = intro.post_train_anomalies(lang, model, two, ["sft", "dpo"], steps=2, seed=3,
                                         batch=4, streams=[0, 0])
    assert not torch.allclose(arms["lm_head.weight"][0], arms["lm_head.weight"][1])
    with pytest.raises(ValueError):
        intro.post_train_anomalies(lang, model, two, ["sft"], steps=1)
