"""Tests for the tiny GPT: causality, training, hooks, checkpoints, Linear swapping, evaluation."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from icml26 import nn as tnn
from icml26.language import zipf_markov_source

SMALL = tnn.GPTConfig(vocab_size=16, context=12, d_model=32, n_layers=2, n_heads=4)


@pytest.fixture
def model():
    return tnn.TinyGPT(SMALL, seed=1).eval()


def test_changing_future_tokens_cannot_change_past_logits(model):
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(16, (3, 12), generator=generator)
    changed = tokens.clone()
    changed[:, 7:] = torch.randint(16, (3, 5), generator=generator)
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert torch.equal(before[:, :7], after[:, :7])
    assert not torch.allclose(before[:, 7:], after[:, 7:])


def test_bidirectional_config_sees_the_future():
    encoder = tnn.TinyGPT(tnn.GPTConfig(vocab_size=16, context=8, d_model=16, n_heads=2,
                                        causal=False)).eval()
    tokens = torch.zeros(1, 8, dtype=torch.long)
    changed = tokens.clone()
    changed[0, -1] = 5
    with torch.no_grad():
        assert not torch.allclose(encoder(tokens)[:, 0], encoder(changed)[:, 0])


def test_attention_rows_are_causal_distributions(model):
    tokens = torch.randint(16, (2, 12), generator=torch.Generator().manual_seed(3))
    _, cache = tnn.run_with_cache(model, tokens, ["blocks.1.attn.hook_pattern"])
    pattern = cache["blocks.1.attn.hook_pattern"]
    assert pattern.shape == (2, 4, 12, 12)
    torch.testing.assert_close(pattern.sum(-1), torch.ones(2, 4, 12))
    assert (pattern.triu(1) == 0).all()


def test_tiny_model_overfits_a_deterministic_language():
    periodic = (torch.arange(40)[None, :] + torch.arange(6)[:, None] * 3) % 10  # x_{t+1} = x_t + 1
    config = tnn.GPTConfig(vocab_size=10, context=8, d_model=32, n_layers=1, n_heads=2)
    net = tnn.TinyGPT(config, seed=0)
    result = tnn.train(net, periodic, steps=150, batch_size=16, lr=1e-2, seed=0)
    assert result.losses[0] > 2.0  # starts near log(10)
    assert tnn.evaluate_nll(net, periodic) < 0.05


def test_training_is_deterministic_given_the_seed():
    tokens = torch.randint(16, (20, 13), generator=torch.Generator().manual_seed(0))
    runs = []
    for _ in range(2):
        net = tnn.TinyGPT(SMALL, seed=5)
        runs.append(tnn.train(net, tokens, steps=5, batch_size=4, lr=1e-3, seed=9).losses)
    assert runs[0] == runs[1]


def test_checkpoint_round_trip(model, tmp_path):
    tokens = torch.randint(16, (2, 12), generator=torch.Generator().manual_seed(1))
    path = tnn.save_checkpoint(model, tmp_path / "ckpt" / "model.pt", step=7, note="hello")
    loaded, metadata = tnn.load_checkpoint(path)
    assert metadata == {"step": 7, "note": "hello"}
    assert loaded.config == model.config
    with torch.no_grad():
        assert torch.equal(loaded(tokens), model(tokens))


def test_periodic_checkpoints_during_training(tmp_path):
    tokens = torch.randint(16, (10, 13), generator=torch.Generator().manual_seed(0))
    net = tnn.TinyGPT(SMALL)
    result = tnn.train(net, tokens, steps=5, batch_size=2, checkpoint_dir=tmp_path,
                       checkpoint_every=2)
    assert [p.name for p in result.checkpoints] == ["step-000002.pt", "step-000004.pt",
                                                    "step-000005.pt"]
    last, metadata = tnn.load_checkpoint(result.checkpoints[-1])
    assert metadata["step"] == 5
    for a, b in zip(last.state_dict().values(), net.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_hidden_states_feed_the_head(model):
    tokens = torch.randint(16, (2, 12), generator=torch.Generator().manual_seed(2))
    states = tnn.hidden_states(model, tokens)
    assert states.shape == (3, 2, 12, 32)
    with torch.no_grad():
        torch.testing.assert_close(model.lm_head(model.ln_f(states[-1])), model(tokens))
        embedded = model.tok_emb(tokens) + model.pos_emb(torch.arange(12))
    torch.testing.assert_close(states[0], embedded)


def test_hooks_can_steer_and_are_removed(model):
    tokens = torch.randint(16, (1, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        base = model(tokens)
        with tnn.hooks(model, {"blocks.0.hook_resid_post": lambda x: x + 1.0}):
            steered = model(tokens)
        with tnn.hooks(model, {"blocks.0.hook_resid_post": lambda x: None}):
            read_only = model(tokens)
        after = model(tokens)
    assert not torch.allclose(base, steered)
    assert torch.equal(base, read_only) and torch.equal(base, after)
    with pytest.raises(ValueError, match="unknown hook points"), \
            tnn.hooks(model, {"blocks.9.hook_resid_post": lambda x: x}):
        pass


def test_record_inputs_sees_the_normalised_residual_stream(model):
    tokens = torch.randint(16, (2, 12), generator=torch.Generator().manual_seed(5))
    inputs = tnn.record_inputs(model, tokens, ["blocks.1.attn.qkv", "blocks.0.mlp.fc_out"])
    _, cache = tnn.run_with_cache(model, tokens, ["blocks.1.hook_resid_pre",
                                                  "blocks.0.mlp.hook_post"])
    with torch.no_grad():
        expected = model.blocks[1].ln1(cache["blocks.1.hook_resid_pre"]).flatten(0, 1)
    torch.testing.assert_close(inputs["blocks.1.attn.qkv"], expected)
    torch.testing.assert_close(inputs["blocks.0.mlp.fc_out"],
                               cache["blocks.0.mlp.hook_post"].flatten(0, 1))


class Shifted(nn.Module):
    """A Linear replacement that adds a constant to the output."""

    def __init__(self, linear, shift):
        super().__init__()
        self.linear, self.shift = linear, shift

    def forward(self, x):
        return self.linear(x) + self.shift


def test_replace_linears_swaps_every_block_linear(model):
    tokens = torch.randint(16, (2, 12), generator=torch.Generator().manual_seed(6))
    names = list(tnn.linear_layers(model))
    assert names == ["blocks.0.attn.qkv", "blocks.0.attn.proj", "blocks.0.mlp.fc_in",
                     "blocks.0.mlp.fc_out", "blocks.1.attn.qkv", "blocks.1.attn.proj",
                     "blocks.1.mlp.fc_in", "blocks.1.mlp.fc_out"]
    with torch.no_grad():
        base = model(tokens)
        assert tnn.replace_linears(model, lambda name, lin: Shifted(lin, 0.0)) == names
        torch.testing.assert_close(model(tokens), base)
        tnn.replace_linears(model, lambda name, lin: Shifted(lin, 1.0), ["lm_head"])
        torch.testing.assert_close(model(tokens), base + 1.0)
    assert all(name.endswith(".linear") for name in tnn.linear_layers(model))
    with pytest.raises(ValueError, match="not Linear"):
        tnn.replace_linears(model, lambda name, lin: lin, ["blocks.0.ln1"])


class Oracle(nn.Module):
    """Predicts with the true Markov transition table (needs order-2 context)."""

    def __init__(self, source, context):
        super().__init__()
        self.source = source
        self.config = tnn.GPTConfig(vocab_size=source.vocab_size, context=context)

    def forward(self, tokens):
        V = self.source.vocab_size
        previous = torch.cat([torch.zeros_like(tokens[:, :1]), tokens[:, :-1]], dim=1)
        table = torch.as_tensor(np.log(self.source.transition))
        return table[(previous * V + tokens).numpy()]


def test_evaluate_nll_reaches_the_entropy_rate_with_the_true_model():
    source = zipf_markov_source(vocab_size=8, order=2, seed=2)
    tokens = source.sample(300, 25, seed=3)
    oracle = Oracle(source, context=12)
    expected = -source.log_prob(tokens).mean()  # every target with two tokens of context
    assert tnn.evaluate_nll(oracle, tokens, min_context=2) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(source.entropy_rate, abs=0.05)


def test_evaluate_nll_matches_cross_entropy_by_hand(model):
    tokens = torch.randint(16, (5, 13), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        logits = model(tokens[:, :-1])
    by_hand = torch.nn.functional.cross_entropy(logits[:, 2:].flatten(0, 1),
                                                tokens[:, 3:].flatten())
    assert tnn.evaluate_nll(model, tokens, min_context=3) == pytest.approx(by_hand.item(),
                                                                          rel=1e-6)


def test_distillation_from_itself_is_zero_and_schedule_shape(model):
    tokens = torch.randint(16, (2, 12), generator=torch.Generator().manual_seed(9))
    loss = tnn.distillation_loss(model, temperature=2.0)(model, tokens, tokens)
    assert abs(loss.item()) < 1e-6
    assert tnn.cosine_schedule(0, 100, 10) == pytest.approx(0.1)
    assert tnn.cosine_schedule(10, 100, 10) == pytest.approx(1.0)
    assert tnn.cosine_schedule(100, 100, 10) == pytest.approx(0.1)
    assert tnn.cosine_schedule(55, 100, 10) == pytest.approx(0.55)
    assert math.isclose(tnn.count_parameters(model), sum(p.numel() for p in model.parameters()))


def test_bad_input_is_refused(model):
    with pytest.raises(ValueError, match="divisible"):
        tnn.GPTConfig(d_model=30, n_heads=4)
    with pytest.raises(TypeError):
        tnn.GPTConfig(vocab_size=3.0)
    with pytest.raises(ValueError, match="exceeds the context"):
        model(torch.zeros(1, 13, dtype=torch.long))
    with pytest.raises(ValueError, match="batch, time"):
        model(torch.zeros(12, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        tnn.train(model, np.zeros((4, 13)), steps=1)
    with pytest.raises(ValueError, match="too short"):
        tnn.train(model, np.zeros((4, 5), dtype=int), steps=1)
    with pytest.raises(ValueError, match="leaves no targets"):
        tnn.evaluate_nll(model, np.zeros((4, 5), dtype=int), min_context=5)
    with pytest.raises(TypeError):
        tnn.save_checkpoint(nn.Linear(2, 2), "unused.pt")


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adamw_matches_torch(weight_decay):
    torch.manual_seed(5)
    ours = torch.nn.Linear(6, 3)
    ref = torch.nn.Linear(6, 3)
    ref.load_state_dict(ours.state_dict())
    opt = tnn.AdamW(list(ours.parameters()), lr=0.05, weight_decay=weight_decay)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=0.05, weight_decay=weight_decay,
                                foreach=False)
    for step in range(20):
        x = torch.randn(8, 6)
        lr = 0.05 * (0.5 if step % 3 else 1.0)  # a schedule: changing learning rates
        for group in opt_ref.param_groups:
            group["lr"] = lr
        for model, optim in ((ours, opt), (ref, opt_ref)):
            optim.zero_grad()
            (model(x) ** 2).mean().backward()
        opt.step(lr)
        opt_ref.step()
    for a, b in zip(ours.parameters(), ref.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    with pytest.raises(ValueError):
        tnn.AdamW([], lr=0.1)
    with pytest.raises(ValueError):
        tnn.AdamW(list(ours.parameters()), lr=float("nan"))


def test_stacked_fit_trains_each_replicate_as_an_independent_run():
    models = [torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
              for _ in range(3)]
    for seed, model in enumerate(models):
        torch.manual_seed(seed)
        for p in model.parameters():
            torch.nn.init.normal_(p)
    x = torch.randn(3, 8, 3, generator=torch.Generator().manual_seed(0))
    template = models[0]

    def loss_of(params, step):
        return tnn.stacked_logits(template, params, x * (1 + step)).pow(2).mean((1, 2))

    stacked = tnn.stack_models(models)
    losses = tnn.stacked_fit(stacked, loss_of, steps=5, lr=0.05, grad_clip=0.5)
    assert losses.shape == (5, 3)
    for r, model in enumerate(models):  # replicate r alone, in a stack of one
        alone = tnn.stack_models([model])
        alone_losses = tnn.stacked_fit(
            alone, lambda p, step, r=r: tnn.stacked_logits(template, p, x[r:r + 1] * (1 + step))
            .pow(2).mean((1, 2)), steps=5, lr=0.05, grad_clip=0.5)
        assert torch.allclose(losses[:, r], alone_losses[:, 0], atol=1e-6)
        back = tnn.unstack(template, stacked, r)
        for name, p in back.named_parameters():
            assert torch.allclose(p, alone[name][0], atol=1e-6)
        assert not back.training
    # the original models are untouched: the stack holds copies
    assert not torch.allclose(tnn.unstack(template, stacked, 0)[0].weight, models[0][0].weight)


def test_stacking_rejects_bad_input():
    with pytest.raises(ValueError, match="at least one model"):
        tnn.stack_models([])
    params = tnn.stack_models([torch.nn.Linear(2, 1)])
    with pytest.raises(ValueError, match="steps"):
        tnn.stacked_fit(params, lambda p, step: p["weight"].sum((1, 2)), steps=0, lr=0.1)
