"""Tests for the offline SmolLM2-135M-Instruct: loading, cache, prompts, residual stream, hooks."""

import json
import shutil
import socket
from types import SimpleNamespace

import pytest
import torch

from icml26 import llm

QUESTION = "What is the capital of France? Answer in one word."


@pytest.fixture(scope="module")
def lm():
    """One load per module, from the real cache (built here on a fresh clone)."""
    return llm.load()


@pytest.fixture(scope="module")
def prompts(lm):
    return [llm.chat(lm, QUESTION), llm.chat(lm, "Is the sky green? Answer Yes or No."),
            llm.chat(lm, "Name a colour.", system="You answer briefly.")]


def _hook_count(lm) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in lm.model.modules())


def test_load_with_the_network_refused(lm, monkeypatch):
    attempts = []

    def refuse(_sock, address):
        attempts.append(address)
        raise ConnectionRefusedError(f"network refused in this test: {address}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    loaded = llm.load()
    assert attempts == []
    parameters = list(loaded.model.parameters())
    assert {p.dtype for p in parameters} == {torch.float32}
    assert {p.device.type for p in parameters} == {"cpu"}
    assert not loaded.model.training and not any(p.requires_grad for p in parameters)
    for a, b in zip(parameters, lm.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_network_refused_blocks_remote_connections_and_restores_sockets():
    connect = socket.socket.connect
    with llm.network_refused(), socket.socket() as sock:
        with pytest.raises(ConnectionRefusedError, match="offline"):
            sock.connect(("192.0.2.1", 80))  # a documentation address: never reached
        with pytest.raises(ConnectionRefusedError, match="offline"):
            sock.connect_ex(("example.org", 443))
    assert socket.socket.connect is connect
    with llm.network_refused(), socket.socket() as server, socket.socket() as client:
        server.bind(("127.0.0.1", 0))
        server.listen()
        client.connect(server.getsockname())  # loopback stays open


def test_the_model_has_the_published_shape(lm):
    assert (lm.n_layers, lm.d_model) == (30, 576)
    assert sum(p.numel() for p in lm.model.parameters()) == 134_515_008
    assert lm.model.config.vocab_size == 49152


def test_greedy_answer_to_a_factual_question_is_deterministic(lm, prompts):
    answer = llm.generate(lm, prompts[0], max_new_tokens=16)
    assert answer == "The capital of France is Paris."
    assert llm.generate(lm, prompts[0], max_new_tokens=16) == answer
    batched = llm.generate(lm, prompts[:2], max_new_tokens=16)
    assert isinstance(batched, list) and batched[0] == answer


def test_chat_uses_the_models_own_template(lm):
    text = llm.chat(lm, "Hi", answer_prefix="Sure")
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nSure")
    custom = llm.chat(lm, "Hi", system="Be terse.")
    assert custom.startswith("<|im_start|>system\nBe terse.<|im_end|>\n")


def test_tokenizer_round_trip(lm, prompts):
    texts = [*prompts, "Grüße, naïve café — 3.14 ≈ π!", "  leading spaces\tand\ttabs\n"]
    for text in texts:
        ids = lm.tokenizer.encode(text, add_special_tokens=False)
        assert lm.tokenizer.decode(ids) == text
    assert llm.token_id(lm, "Yes") != llm.token_id(lm, "No")
    assert lm.tokenizer.decode([llm.token_id(lm, "Yes")]) == "Yes"


def test_batched_scores_match_one_prompt_at_a_time(lm, prompts):
    batched = llm.next_token_logprobs(lm, prompts)
    assert batched.shape == (3, 49152)
    assert torch.allclose(batched.exp().sum(-1), torch.ones(3), atol=1e-4)
    for row, prompt in zip(batched, prompts, strict=True):
        assert torch.allclose(row, llm.next_token_logprobs(lm, prompt)[0], atol=1e-4)
    odds = llm.log_odds(lm, prompts)
    yes, no = llm.token_id(lm, "Yes"), llm.token_id(lm, "No")
    assert torch.allclose(odds, batched[:, yes] - batched[:, no], atol=1e-5)


def test_hidden_states_have_one_layer_per_block_plus_one(lm, prompts):
    batch = llm.encode(lm, prompts)
    states = llm.hidden_states(lm, prompts)
    assert states.shape == (31, 3, batch["input_ids"].shape[1], 576)
    # Layer 0 is the token embedding; the last layer, read through the lens, is the model's output.
    assert torch.equal(states[0], lm.model.model.embed_tokens(batch["input_ids"]))
    lens = llm.logit_lens(lm, states[-1][:, -1])
    assert torch.allclose(lens, llm.next_token_logprobs(lm, prompts), atol=1e-4)
    assert torch.equal(llm.hidden_states(lm, prompts, layers=[7])[0], states[7])


def test_unembedding_is_tied_to_the_embedding(lm):
    W_U = llm.unembedding(lm)
    assert W_U.shape == (49152, 576)
    assert W_U.data_ptr() == lm.model.model.embed_tokens.weight.data_ptr()


def test_zero_injection_leaves_the_logits_identical(lm, prompts):
    before = llm.next_token_logprobs(lm, prompts)
    for layer in (0, 15, 30):
        with llm.inject(lm, layer, torch.zeros(576)):
            assert torch.equal(llm.next_token_logprobs(lm, prompts), before)


def test_injection_at_one_position_leaves_earlier_positions_alone(lm, prompts):
    vector = torch.randn(576, generator=torch.Generator().manual_seed(0))
    before = llm.hidden_states(lm, prompts, layers=[20])[0]
    with llm.inject(lm, 5, vector, positions=-1, scale=10.0):
        after = llm.hidden_states(lm, prompts, layers=[20])[0]
    assert torch.equal(after[:, :-1], before[:, :-1])
    assert (after[:, -1] - before[:, -1]).norm(dim=-1).min() > 1.0


def test_replacing_the_stream_sets_it_to_the_vector(lm, prompts):
    vectors = torch.randn(3, 576, generator=torch.Generator().manual_seed(1))
    with llm.inject(lm, 10, vectors, positions=[0, -1], replace=True):
        states = llm.hidden_states(lm, prompts, layers=[10])[0]
    assert torch.equal(states[:, 0], vectors) and torch.equal(states[:, -1], vectors)
    assert not torch.equal(states[:, 1], vectors)


def test_injecting_a_tokens_unembedding_row_raises_its_logprob(lm, prompts):
    token = llm.token_id(lm, "Paris")
    row = llm.unembedding(lm)[token]
    for layer in (20, 30):
        logprobs = []
        for scale in (0.0, 4.0, 16.0):
            with llm.inject(lm, layer, row, positions=-1, scale=scale):
                logprobs.append(llm.next_token_logprobs(lm, prompts[1])[0, token].item())
        assert logprobs[0] < logprobs[1] < logprobs[2], (layer, logprobs)


def test_hooks_are_gone_after_the_context_even_when_the_body_raises(lm, prompts):
    assert _hook_count(lm) == 0
    with pytest.raises(RuntimeError, match="inside"), llm.inject(lm, 3, torch.ones(576)):
        assert _hook_count(lm) == 1
        raise RuntimeError("inside the block")
    with pytest.raises(RuntimeError, match="inside"), llm.capture(lm, [0, 30]) as records:
        llm.next_token_logprobs(lm, prompts[0])
        assert [len(records[0]), len(records[30])] == [1, 1]
        raise RuntimeError("inside the block")
    assert _hook_count(lm) == 0
    assert torch.equal(llm.next_token_logprobs(lm, prompts), llm.next_token_logprobs(lm, prompts))


def test_bad_input_raises_clear_errors(lm, tmp_path):
    zero = torch.zeros(576)
    with pytest.raises(ValueError, match="layer"), llm.inject(lm, 31, torch.zeros(576)):
        pass
    with pytest.raises(ValueError, match="576"), llm.inject(lm, 3, torch.zeros(10)):
        pass
    with pytest.raises(TypeError, match="positions"), llm.inject(lm, 3, zero, positions=[]):
        pass
    with pytest.raises(ValueError, match="finite"), llm.inject(lm, 3, zero / 0):
        pass
    with pytest.raises(ValueError, match="not one"):
        llm.token_id(lm, "Paris is lovely")
    with pytest.raises(ValueError, match="prompts"):
        llm.next_token_logprobs(lm, [])
    with pytest.raises(ValueError, match="empty"):
        llm.chat(lm, "  ")
    with pytest.raises(ValueError, match="gguf"):
        llm.load(tmp_path / "weights.bin")
    with pytest.raises(ValueError, match="stream"):
        llm.logit_lens(lm, torch.zeros(3, 10))


def test_model_source_uses_the_local_model_only_at_full_tier(monkeypatch, tmp_path):
    monkeypatch.setenv(llm.SOURCE_ENV, str(tmp_path))
    assert llm.model_source("full") == tmp_path
    assert llm.model_source("book") is None
    monkeypatch.delenv(llm.SOURCE_ENV)
    assert llm.model_source("full") is None
    with pytest.raises(ValueError, match="tier"):
        llm.model_source("huge")


def test_a_checkpoint_directory_loads_as_it_is(lm):
    direct = llm.load(lm.checkpoint)
    assert direct.checkpoint == lm.checkpoint
    assert torch.equal(direct.model.lm_head.weight, lm.model.lm_head.weight)


def test_corrupted_or_partial_cache_is_detected_and_rebuilt(lm, tmp_path):
    digest, cached = llm.file_sha256(llm.gguf_path()), lm.checkpoint
    assert cached.name == f"{llm.GGUF_NAME.removesuffix('.gguf')}-{digest[:16]}"
    copy = tmp_path / cached.name
    shutil.copytree(cached, copy)
    assert llm.cache_is_valid(copy, digest)
    assert not llm.cache_is_valid(copy, "0" * 64)
    weights = copy / "model.safetensors"
    with weights.open("r+b") as handle:  # flip bytes in the middle of the weights
        handle.seek(weights.stat().st_size // 2)
        handle.write(b"\x7f" * 64)
    assert not llm.cache_is_valid(copy, digest)
    partial = tmp_path / "partial"
    shutil.copytree(cached, partial)
    (partial / llm.MANIFEST).unlink()
    assert not llm.cache_is_valid(partial, digest)
    truncated = tmp_path / "truncated"
    shutil.copytree(cached, truncated)
    with (truncated / "tokenizer.json").open("r+b") as handle:
        handle.truncate(100)
    assert not llm.cache_is_valid(truncated, digest)

    # The rebuild runs whole (staging, manifest, the rename over the corrupted copy); only the
    # dequantisation of the GGUF, which the fresh-clone load above exercised, is answered from
    # memory. Reading the rebuilt cache back goes through transformers as usual.
    real = llm._quiet_transformers()

    def reader(auto, dequantised):
        return SimpleNamespace(from_pretrained=lambda *args, **kwargs: dequantised
                               if "gguf_file" in kwargs else auto.from_pretrained(*args, **kwargs))

    quick = SimpleNamespace(AutoModelForCausalLM=reader(real.AutoModelForCausalLM, lm.model),
                            AutoTokenizer=reader(real.AutoTokenizer, lm.tokenizer))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(llm, "_quiet_transformers", lambda: quick)
        rebuilt = llm.load(cache_dir=tmp_path)
    assert llm.cache_is_valid(copy, digest)
    assert json.loads((copy / llm.MANIFEST).read_text())["gguf_sha256"] == digest
    for a, b in zip(rebuilt.model.parameters(), lm.model.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.fixture(scope="module")
def shared_prefix(lm):
    parts = [llm.split_chat(lm, f"Tell me about {word}.", f" {word}.")
             for word in ("bread", "ocean", "music")]
    assert len({prefix for prefix, _ in parts}) == 1
    return parts[0][0], [suffix for _, suffix in parts]


def test_suffix_pass_equals_scoring_each_whole_prompt(lm, shared_prefix):
    prefix, suffixes = shared_prefix
    whole = llm.next_token_logprobs(lm, [prefix + suffix for suffix in suffixes])
    torch.testing.assert_close(llm.suffix_pass(lm, prefix, suffixes), whole,
                               atol=2e-4, rtol=1e-4)
    stream = llm.hidden_states(lm, [prefix + suffix for suffix in suffixes], [12])[0, :, -1]
    torch.testing.assert_close(llm.suffix_pass(lm, prefix, suffixes, read_layer=12), stream,
                               atol=2e-4, rtol=1e-4)


def test_suffix_pass_injects_on_the_suffix_tokens_only(lm, shared_prefix):
    prefix, suffixes = shared_prefix
    length = len(lm.tokenizer(suffixes[0], add_special_tokens=False)["input_ids"])
    vectors = torch.randn(3, lm.d_model, generator=torch.Generator().manual_seed(0))
    with llm.inject(lm, 6, vectors, scale=4.0, positions=list(range(-length, 0))):
        whole = llm.next_token_logprobs(lm, [prefix + suffix for suffix in suffixes])
    steered = llm.suffix_pass(lm, prefix, suffixes, vectors=vectors, layer=6, scale=4.0)
    torch.testing.assert_close(steered, whole, atol=2e-4, rtol=1e-4)
    assert (steered - llm.suffix_pass(lm, prefix, suffixes)).abs().max() > 0.1
    assert _hook_count(lm) == 0


def test_shared_prefix_helpers_reject_bad_input(lm, shared_prefix):
    prefix, suffixes = shared_prefix
    with pytest.raises(ValueError, match="same number of tokens"):
        llm.suffix_pass(lm, prefix, [suffixes[0], suffixes[0] + " And more words."])
    with pytest.raises(ValueError, match="does not occur"):
        llm.split_chat(lm, "Tell me about bread.", " cheese")
    with pytest.raises(ValueError, match="non-empty"):
        llm.suffix_pass(lm, prefix, [])
    assert _hook_count(lm) == 0
