r"""Megatron-style tensor parallelism of :class:`icml26.nn.TinyGPT`, simulated and real.

Each block is split over $p$ ranks ({eq}`eq-ccq-megatron`): the fused ``qkv`` projection and
``fc_in`` are column-parallel (each rank owns $H/p$ heads and $d_{\mathrm{mlp}}/p$ hidden units,
no communication), ``proj`` and ``fc_out`` are row-parallel and end in a sum of partial results
over the ranks, the two all-reduces of a layer. Here that sum is an **all-gather of encoded
partials followed by a local dequantise-sum** (:mod:`icml26.cocoquant.quant`), so that a
quantised partial is quantised once, by its owner, and every rank ends with the same sum.

The same code runs two ways:

* :func:`simulate_logits` computes every rank's shard in one process and "gathers" the encoded
  partials in a list;
* :func:`run_tensor_parallel` spawns ``world_size`` processes that talk through
  ``torch.distributed`` (gloo backend, TCP on 127.0.0.1), one thread each, and counts the bytes
  every rank hands to its collectives. The worker :func:`_tp_worker` lives here because spawned
  processes import their target by name.

Everything runs in float64, so that the two ways see the same rounding inputs and their logits
agree to round-off (a quantiser that flips one code would otherwise show up as a large error).
Weights are fake-quantised per output channel on the full matrix before sharding; activations
of a row-parallel GEMM are quantised per token *per rank* (each rank sees only its slice).
"""

from __future__ import annotations

import math
import os
import socket
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F  # noqa: N812

from icml26.cocoquant.quant import (
    COMM_PRECISIONS,
    GEMM_PRECISIONS,
    comm_bits,
    decode_sum,
    encode_partial,
    fake_quantise,
    gemm_bits,
)
from icml26.core import check_count
from icml26.nn import GPTConfig, TinyGPT

GEMM_SITES = ("qkv", "proj", "fc_in", "fc_out")
COMM_SITES = ("attn_ar", "mlp_ar")


def site_names(n_layers: int) -> list[str]:
    """Every precision site of an ``n_layers`` model, in execution order (``"0.qkv"``, ...)."""
    check_count(n_layers, "n_layers", 1)
    order = ("qkv", "proj", "attn_ar", "fc_in", "fc_out", "mlp_ar")
    return [f"{layer}.{name}" for layer in range(n_layers) for name in order]


def site_kind(site: str) -> str:
    """``"gemm"`` or ``"comm"`` for a site name such as ``"1.fc_out"``."""
    name = site.partition(".")[2]
    if name in GEMM_SITES:
        return "gemm"
    if name in COMM_SITES:
        return "comm"
    raise ValueError(f"unknown site {site!r}")


def site_options(site: str) -> tuple[str, ...]:
    """The precisions a site may take."""
    return GEMM_PRECISIONS if site_kind(site) == "gemm" else COMM_PRECISIONS


def consumer(site: str, n_layers: int) -> str | None:
    """The GEMM that reads the output of communication site ``site`` (after residual + norm).

    ``"l.attn_ar"`` feeds ``"l.fc_in"``; ``"l.mlp_ar"`` feeds the next layer's ``qkv``, or the
    unquantised output head (``None``) after the last layer.
    """
    layer, _, name = site.partition(".")
    if name == "attn_ar":
        return f"{layer}.fc_in"
    if name == "mlp_ar":
        nxt = int(layer) + 1
        return f"{nxt}.qkv" if nxt < n_layers else None
    raise ValueError(f"{site!r} is not a communication site")


def uniform_config(n_layers: int, gemm: str = "w16a16", comm: str = "c16",
                   **overrides: str) -> dict[str, str]:
    """A precision per site: ``gemm`` at every GEMM, ``comm`` at every all-reduce.

    ``overrides`` set single sites; a site name's dot is written as an underscore after
    ``l`` (``l0_fc_out="w4a8"``) or pass a dict through :func:`check_config` instead.
    """
    gemm_bits(gemm)
    comm_bits(comm)
    config = {site: gemm if site_kind(site) == "gemm" else comm for site in site_names(n_layers)}
    for key, value in overrides.items():
        site = key[1:].replace("_", ".", 1) if key.startswith("l") else key
        config[site] = value
    return check_config(config, n_layers)


def check_config(config: dict[str, str], n_layers: int) -> dict[str, str]:
    """Validate a complete site -> precision mapping; returns a copy in site order."""
    if not isinstance(config, dict):
        raise TypeError(f"a precision config must be a dict, got {type(config).__name__}")
    sites = site_names(n_layers)
    unknown = sorted(set(config) - set(sites))
    missing = [s for s in sites if s not in config]
    if unknown or missing:
        raise ValueError(f"config has unknown sites {unknown} and lacks {missing}")
    for site in sites:
        if config[site] not in site_options(site):
            raise ValueError(f"unknown precision {config[site]!r} at {site}; choose one of "
                             f"{site_options(site)}")
    return {site: config[site] for site in sites}


def check_world_size(config: GPTConfig, world_size: int) -> int:
    """``world_size`` if it divides the heads and the MLP width, else a clear ``ValueError``."""
    world_size = check_count(world_size, "world_size", 1)
    for name, value in (("n_heads", config.n_heads), ("d_mlp", config.d_mlp),
                        ("d_model", config.d_model)):
        if value % world_size:
            raise ValueError(f"world size {world_size} does not divide {name} = {value}")
    return world_size


# --- Sharding --------------------------------------------------------------------------------


def _quantised_weight(weight: torch.Tensor, precision: str) -> torch.Tensor:
    return fake_quantise(weight, gemm_bits(precision)[0])


def shard_model(model: TinyGPT, config: dict[str, str],
                world_size: int) -> tuple[dict, list[list[dict]]]:
    """Replicated parameters and, per rank, per layer, the rank's slices (float64).

    Weights are fake-quantised per output channel at their site's weight bits before slicing.
    """
    cfg = model.config
    world_size = check_world_size(cfg, world_size)
    config = check_config(config, cfg.n_layers)
    state = {k: v.detach().to(torch.float64) for k, v in model.state_dict().items()}
    width, hidden = cfg.d_model, cfg.d_mlp
    replicated = {"tok_emb": state["tok_emb.weight"], "pos_emb": state["pos_emb.weight"],
                  "ln_f": (state["ln_f.weight"], state["ln_f.bias"]),
                  "lm_head": state["lm_head.weight"], "layers": []}
    shards: list[list[dict]] = [[] for _ in range(world_size)]
    for layer in range(cfg.n_layers):
        pre = f"blocks.{layer}."
        weights = {name: _quantised_weight(state[pre + key + ".weight"], config[f"{layer}.{name}"])
                   for name, key in (("qkv", "attn.qkv"), ("proj", "attn.proj"),
                                     ("fc_in", "mlp.fc_in"), ("fc_out", "mlp.fc_out"))}
        replicated["layers"].append({
            "ln1": (state[pre + "ln1.weight"], state[pre + "ln1.bias"]),
            "ln2": (state[pre + "ln2.weight"], state[pre + "ln2.bias"]),
            "proj_b": state[pre + "attn.proj.bias"], "fc_out_b": state[pre + "mlp.fc_out.bias"]})
        qkv_b = state[pre + "attn.qkv.bias"]
        part, hpart = width // world_size, hidden // world_size
        for rank in range(world_size):
            cols = slice(rank * part, (rank + 1) * part)
            rows = [torch.arange(rank * part, (rank + 1) * part) + j * width for j in range(3)]
            rows = torch.cat(rows)
            hrows = slice(rank * hpart, (rank + 1) * hpart)
            shards[rank].append({
                "qkv_w": weights["qkv"][rows], "qkv_b": qkv_b[rows],
                "proj_w": weights["proj"][:, cols].contiguous(),
                "fc_in_w": weights["fc_in"][hrows], "fc_in_b": state[pre + "mlp.fc_in.bias"][hrows],
                "fc_out_w": weights["fc_out"][:, hrows].contiguous()})
    return replicated, shards


def _act(x: torch.Tensor, precision: str) -> torch.Tensor:
    return fake_quantise(x, gemm_bits(precision)[1])


def _attention_partial(a, shard, heads, config, layer):
    batch, time_, _ = a.shape
    qkv = F.linear(_act(a, config[f"{layer}.qkv"]), shard["qkv_w"], shard["qkv_b"])
    q, k, v = qkv.chunk(3, dim=-1)
    q, k, v = (t.reshape(batch, time_, heads, -1).transpose(1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    mask = torch.ones(time_, time_, dtype=torch.bool).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    z = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(batch, time_, -1)
    return F.linear(_act(z, config[f"{layer}.proj"]), shard["proj_w"])


def _mlp_partial(a, shard, config, layer):
    hidden = F.gelu(F.linear(_act(a, config[f"{layer}.fc_in"]), shard["fc_in_w"],
                             shard["fc_in_b"]))
    return F.linear(_act(hidden, config[f"{layer}.fc_out"]), shard["fc_out_w"])


def tp_forward(tokens: torch.Tensor, replicated: dict, shards: list[list[dict]],
               heads_per_rank: int, config: dict[str, str], reduce) -> torch.Tensor:
    """Logits of the sharded model ({eq}`eq-ccq-megatron`).

    ``shards`` holds the slices this process computes (all ranks in a simulation, its own in a
    real run); ``reduce(site, partials)`` returns the sum over *all* ranks of the row-parallel
    partial results, given this process's partials as ``(tokens, width)`` tensors.
    """
    batch, time_ = tokens.shape
    x = replicated["tok_emb"][tokens] + replicated["pos_emb"][:time_]
    width = x.shape[-1]
    for layer, rep in enumerate(replicated["layers"]):
        a = F.layer_norm(x, (width,), *rep["ln1"])
        partials = [_attention_partial(a, s[layer], heads_per_rank, config, layer)
                    .reshape(-1, width) for s in shards]
        x = x + (reduce(f"{layer}.attn_ar", partials).reshape(batch, time_, width)
                 + rep["proj_b"])
        a = F.layer_norm(x, (width,), *rep["ln2"])
        partials = [_mlp_partial(a, s[layer], config, layer).reshape(-1, width) for s in shards]
        x = x + (reduce(f"{layer}.mlp_ar", partials).reshape(batch, time_, width)
                 + rep["fc_out_b"])
    x = F.layer_norm(x, (width,), *replicated["ln_f"])
    return x @ replicated["lm_head"].T


def simulate_logits(model: TinyGPT, tokens: torch.Tensor, config: dict[str, str],
                    world_size: int = 2) -> torch.Tensor:
    """Logits of the quantised tensor-parallel model, computed in one process (float64)."""
    tokens = torch.as_tensor(tokens).long()
    replicated, shards = shard_model(model, config, world_size)
    config = check_config(config, model.config.n_layers)

    def reduce(site, partials):
        rows, width = partials[0].shape
        payloads = [encode_partial(p, config[site]) for p in partials]
        return decode_sum(payloads, rows, width, config[site])

    with torch.no_grad():
        return tp_forward(tokens, replicated, shards, model.config.n_heads // world_size,
                          config, reduce)


def windows_of(sequences, length: int) -> torch.Tensor:
    """Cut every sequence into non-overlapping windows of ``length`` tokens: ``(n, length)``."""
    tokens = torch.as_tensor(np.asarray(sequences)).long()
    if tokens.ndim != 2 or tokens.shape[1] < length:
        raise ValueError(f"need 2-D sequences of at least {length} tokens")
    usable = tokens.shape[1] // length * length
    return tokens[:, :usable].reshape(-1, length)


def batch_nll(model: TinyGPT, windows: torch.Tensor, config: dict[str, str], batches: int,
              world_size: int = 2, min_context: int = 0) -> np.ndarray:
    """Mean next-token loss (nats) of the quantised model on each of ``batches`` disjoint blocks.

    ``windows`` is ``(n, context + 1)``; targets with fewer than ``min_context`` tokens before
    them are not scored (for an order-$k$ source use ``min_context = k``).
    """
    batches = check_count(batches, "batches", 1)
    if len(windows) < batches:
        raise ValueError(f"{len(windows)} windows cannot fill {batches} batches")
    skip = max(min_context - 1, 0)
    values = []
    for block in torch.tensor_split(windows, batches):
        logits = simulate_logits(model, block[:, :-1], config, world_size)[:, skip:]
        targets = block[:, 1:][:, skip:]
        values.append(F.cross_entropy(logits.flatten(0, 1), targets.flatten()).item())
    return np.array(values)


# --- Real tensor parallelism --------------------------------------------------------------------


@dataclass
class TPResult:
    """What a distributed run returns (from every rank).

    ``logits[name]``: rank 0's logits per configuration; ``rank_gap[name]``: the largest
    difference between any rank's logits and rank 0's; ``bytes_sent[name]``: bytes each rank
    handed to its collectives in one forward pass (payload times the ``p - 1`` peers);
    ``wall[name]`` and ``cpu[name]``: median wall-clock and CPU seconds per forward pass on rank 0;
    ``bench``: ``(message bytes, median seconds)`` of bare uint8 all-gathers.
    """

    logits: dict[str, torch.Tensor] = field(default_factory=dict)
    rank_gap: dict[str, float] = field(default_factory=dict)
    bytes_sent: dict[str, list[int]] = field(default_factory=dict)
    wall: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    bench: list[tuple[int, float]] = field(default_factory=list)
    total_seconds: float = 0.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_loop(rank: int, world_size: int, job: dict, all_gather, barrier) -> dict:
    """The work of one rank, given its collectives: ``all_gather(out_list, tensor)``, ``barrier()``.

    Shared by the gloo worker (:func:`_tp_worker`) and the thread stand-in
    (:class:`_ThreadGroup`), so both backends run exactly the same rank-local code.
    """
    model = TinyGPT(GPTConfig(**job["gpt_config"]))
    model.load_state_dict(job["state_dict"])
    tokens = job["tokens"]
    heads = model.config.n_heads // world_size
    out = {"logits": {}, "bytes": {}, "wall": {}, "cpu": {}, "bench": []}
    for name, config in job["configs"].items():
        replicated, shards = shard_model(model, config, world_size)
        sent = [0]

        def reduce(site, partials, config=config, sent=sent):
            rows, width = partials[0].shape
            payload = encode_partial(partials[0], config[site])
            gathered = [torch.empty_like(payload) for _ in range(world_size)]
            all_gather(gathered, payload)
            sent[0] += payload.numel() * (world_size - 1)
            return decode_sum(gathered, rows, width, config[site])

        with torch.no_grad():
            out["logits"][name] = tp_forward(tokens, replicated, [shards[rank]], heads,
                                             config, reduce)
            out["bytes"][name] = sent[0]
            walls, cpus = [], []
            for _ in range(job["repeats"]):
                barrier()
                w0, c0 = time.perf_counter(), time.process_time()
                tp_forward(tokens, replicated, [shards[rank]], heads, config, reduce)
                walls.append(time.perf_counter() - w0)
                cpus.append(time.process_time() - c0)
            out["wall"][name], out["cpu"][name] = float(np.median(walls)), float(
                np.median(cpus))
    for size in job["bench_sizes"]:
        buffer = torch.zeros(size, dtype=torch.uint8)
        gathered = [torch.empty_like(buffer) for _ in range(world_size)]
        times = []
        for _ in range(job["repeats"]):
            barrier()
            t0 = time.perf_counter()
            all_gather(gathered, buffer)
            times.append(time.perf_counter() - t0)
        out["bench"].append((size, float(np.median(times))))
    return out


def _tp_worker(rank: int, world_size: int, port: int, job_path: str, out_dir: str) -> None:
    """One rank of :func:`run_tensor_parallel` (runs in a spawned process)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        job = torch.load(job_path, weights_only=False)
        if job.get("fail_rank") == rank:
            raise RuntimeError(f"rank {rank} failed on purpose (test of the error path)")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size)
        out = _rank_loop(rank, world_size, job, dist.all_gather, dist.barrier)
        torch.save(out, Path(out_dir) / f"rank{rank}.pt")
        dist.barrier()
    except BaseException:
        (Path(out_dir) / f"rank{rank}.err").write_text(traceback.format_exc())
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class _ThreadGroup:
    """An in-process stand-in for a process group: one thread per rank, shared-memory all-gather.

    The tensors are copied through a list guarded by a barrier, so a rank sees its peers'
    payloads only through ``all_gather``, as over gloo; nothing crosses a socket.
    """

    def __init__(self, world_size: int, timeout: float):
        self.world_size = world_size
        self._barrier = threading.Barrier(world_size, timeout=timeout)
        self._slots: list = [None] * world_size

    def barrier(self) -> None:
        self._barrier.wait()

    def all_gather_for(self, rank: int):
        def all_gather(out_list, tensor):
            self._slots[rank] = tensor.clone()
            self._barrier.wait()
            for target, source in zip(out_list, self._slots, strict=True):
                target.copy_(source)
            self._barrier.wait()

        return all_gather

    def run(self, job: dict) -> list[dict]:
        outs: list = [None] * self.world_size
        errors: list[str] = []

        def target(rank):
            try:
                if job.get("fail_rank") == rank:
                    raise RuntimeError(f"rank {rank} failed on purpose (test of the error path)")
                outs[rank] = _rank_loop(rank, self.world_size, job, self.all_gather_for(rank),
                                        self.barrier)
            except threading.BrokenBarrierError:
                pass  # a peer failed first; its error is reported
            except BaseException:
                errors.append(f"rank {rank}:\n{traceback.format_exc()}")
                self._barrier.abort()

        threads = [threading.Thread(target=target, args=(r,), daemon=True)
                   for r in range(self.world_size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors or any(o is None for o in outs):
            detail = "\n".join(errors) or "a barrier timed out"
            raise RuntimeError(f"tensor-parallel run (threads) failed:\n{detail}")
        return outs


def run_tensor_parallel(model: TinyGPT, tokens: torch.Tensor, configs: dict[str, dict],
                        world_size: int = 2, repeats: int = 3, bench_sizes=(),
                        timeout: float = 300.0, fail_rank: int | None = None,
                        backend: str = "processes") -> TPResult:
    """Run ``model`` split over ``world_size`` ranks for every named config.

    ``backend="processes"`` (the real thing) spawns ``world_size`` processes that talk through
    gloo over loopback; one spawn serves every configuration (each process pays torch's import
    once). ``backend="threads"`` runs the same rank-local code (:func:`_rank_loop`) in one thread
    per rank of this process, with an in-memory all-gather: no torch import, no sockets, so
    it is cheap, but its timings say nothing about a network. Every worker is joined, even when
    one fails or the run times out; a failure raises ``RuntimeError`` with the worker's
    traceback. ``fail_rank`` makes that rank raise, to test this path.
    """
    world_size = check_world_size(model.config, world_size)
    repeats = check_count(repeats, "repeats", 1)
    if not configs:
        raise ValueError("give at least one configuration")
    configs = {name: check_config(c, model.config.n_layers) for name, c in configs.items()}
    if backend not in ("processes", "threads"):
        raise ValueError(f"backend must be 'processes' or 'threads', not {backend!r}")
    result = TPResult()
    if backend == "threads":
        job = {"gpt_config": dict(model.config.__dict__),
               "state_dict": {k: v.detach().clone() for k, v in model.state_dict().items()},
               "tokens": torch.as_tensor(tokens).long(), "configs": configs,
               "repeats": repeats, "bench_sizes": [int(s) for s in bench_sizes],
               "fail_rank": fail_rank}
        start = time.perf_counter()
        outs = _ThreadGroup(world_size, timeout).run(job)
        result.total_seconds = time.perf_counter() - start
        return _collect(result, outs, configs)
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="ccq-tp-") as tmp:
        job_path = os.path.join(tmp, "job.pt")
        torch.save({"gpt_config": model.config.__dict__, "state_dict": model.state_dict(),
                    "tokens": torch.as_tensor(tokens).long(), "configs": configs,
                    "repeats": repeats, "bench_sizes": [int(s) for s in bench_sizes],
                    "fail_rank": fail_rank}, job_path)
        port = _free_port()
        saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        processes = []
        start = time.perf_counter()
        try:
            for rank in range(world_size):
                process = context.Process(target=_tp_worker,
                                          args=(rank, world_size, port, job_path, tmp))
                process.start()
                processes.append(process)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        failed = False
        try:
            deadline = time.monotonic() + timeout
            while any(p.is_alive() for p in processes):
                if any(p.exitcode not in (None, 0) for p in processes):
                    failed = True
                    break
                if time.monotonic() > deadline:
                    failed = True
                    break
                for p in processes:
                    p.join(timeout=0.05)
        finally:
            for p in processes:
                if p.is_alive():
                    p.terminate()
            for p in processes:
                p.join()
        errors = [(Path(tmp) / f"rank{r}.err") for r in range(world_size)]
        messages = [e.read_text() for e in errors if e.exists()]
        if failed or messages or any(p.exitcode != 0 for p in processes):
            codes = [p.exitcode for p in processes]
            detail = "\n".join(messages) or "no traceback (timed out or killed)"
            raise RuntimeError(f"tensor-parallel run failed (exit codes {codes}):\n{detail}")
        result.total_seconds = time.perf_counter() - start
        outs = [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=False)
                for r in range(world_size)]
    return _collect(result, outs, configs)


def _collect(result: TPResult, outs: list[dict], configs: dict) -> TPResult:
    """Fill ``result`` from every rank's output dict."""
    for name in configs:
        result.logits[name] = outs[0]["logits"][name]
        result.rank_gap[name] = max(float((o["logits"][name] - outs[0]["logits"][name])
                                          .abs().max()) for o in outs)
        result.bytes_sent[name] = [o["bytes"][name] for o in outs]
        result.wall[name], result.cpu[name] = outs[0]["wall"][name], outs[0]["cpu"][name]
    result.bench = outs[0]["bench"]
    return result
