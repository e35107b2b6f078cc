r"""The roofline cost model of one tensor-parallel transformer, site by site.

A GEMM of shape $M \times K \times N$ at weight bits $b_w$ and activation bits $b_a$ takes
({eq}`eq-ccq-roofline`)

$$t = t_{\mathrm{launch}} + \max\Bigl(\frac{2MKN}{\pi(b_a)},\ \frac{(MK b_a + KN b_w)/8 + 2MN}
{\beta_{\mathrm{mem}}}\Bigr),$$

with $\pi(16)$, $\pi(8)$, $\pi(4)$ the dense FP16, INT8 and INT4 tensor-core peaks (W4A8
unpacks its weights to INT8 inside the kernel, so it runs at the INT8 rate and only reads fewer
bytes; W4A4 runs at the INT4 rate).
A collective over a link with per-direction bandwidth $\beta$ and per-step latency $\alpha$ takes
$\alpha \cdot \text{steps} + \text{bytes} / \beta$ ({eq}`eq-ccq-comm`): a ring all-reduce of
float16 partials, $2(p-1)$ steps and $2\tfrac{p-1}{p}\,Th\cdot 2$ bytes per rank; the all-gather
of quantised partials, $p-1$ steps and $(p-1)$ payloads. A quantised all-reduce whose precision
does not match the consumer GEMM's activation format pays an extra quantise and dequantise kernel
({eq}`eq-ccq-align`); when it matches, the rewrite fuses both into kernels that run anyway.

The constants of :data:`PCIE_A100` and :data:`NVLINK_A100` are NVIDIA's A100 datasheet peaks as
quoted by third-party specification tables (the datasheet itself was not read);
the two latencies are assumptions (no datasheet gives them), stated as such in the chapter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from icml26.cocoquant.quant import SCALE_BYTES, comm_bits, gemm_bits
from icml26.cocoquant.tp import consumer, site_kind, site_names
from icml26.core import check_count


@dataclass(frozen=True)
class HardwareProfile:
    """Peak rates of one accelerator and its link (SI units: FLOP/s, bytes/s, seconds)."""

    name: str
    fp16_flops: float
    int8_ops: float
    int4_ops: float
    hbm_bandwidth: float
    link_bandwidth: float
    link_latency: float
    kernel_latency: float
    source: str = ""

    def __post_init__(self) -> None:
        for item in fields(self):
            if item.name in ("name", "source"):
                continue
            value = getattr(self, item.name)
            if value is None:
                raise ValueError(f"hardware profile {self.name!r} misses the constant "
                                 f"{item.name!r}")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{item.name} must be a number, got {type(value).__name__}")
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{item.name} must be positive and finite, got {value}")

    def rate(self, activation_bits: int) -> float:
        """Peak GEMM throughput for activations of ``activation_bits`` (16 or 8)."""
        if activation_bits == 16:
            return self.fp16_flops
        if activation_bits == 8:
            return self.int8_ops
        if activation_bits == 4:
            return self.int4_ops
        raise ValueError(f"no tensor-core rate for {activation_bits}-bit activations")


A100_DATASHEET = ("NVIDIA A100 Tensor Core GPU datasheet figures, as quoted by third-party "
                  "specification tables (vendor peaks, not measured): "
                  "dense FP16 tensor core 312 TFLOPS, "
                  "dense INT8 624 TOPS, dense INT4 1,248 TOPS; 80GB PCIe: 1,935 GB/s HBM2e, "
                  "PCIe Gen4 64 GB/s; "
                  "80GB SXM: 2,039 GB/s HBM2e, NVLink 600 GB/s (both link numbers count both "
                  "directions, so one direction gets half)")

PCIE_A100 = HardwareProfile("A100 PCIe, PCIe Gen4 x16", fp16_flops=312e12, int8_ops=624e12,
                            int4_ops=1248e12,
                            hbm_bandwidth=1935e9, link_bandwidth=32e9, link_latency=10e-6,
                            kernel_latency=5e-6, source=A100_DATASHEET)
"""Two A100 80GB PCIe cards talking over PCIe Gen4 (32 GB/s per direction)."""

NVLINK_A100 = HardwareProfile("A100 SXM, NVLink 3", fp16_flops=312e12, int8_ops=624e12,
                              int4_ops=1248e12,
                              hbm_bandwidth=2039e9, link_bandwidth=300e9, link_latency=5e-6,
                              kernel_latency=5e-6, source=A100_DATASHEET)
"""Two A100 80GB SXM GPUs talking over NVLink (300 GB/s per direction)."""


@dataclass(frozen=True)
class Deployment:
    """The shape the latency is predicted for: ``tokens`` per forward pass (prefill), widths."""

    tokens: int = 4096
    d_model: int = 4096
    d_mlp: int = 16384
    n_heads: int = 32
    n_layers: int = 2
    world_size: int = 2

    def __post_init__(self) -> None:
        for item in fields(self):
            check_count(getattr(self, item.name), item.name, 1)
        for name in ("d_model", "d_mlp", "n_heads"):
            if getattr(self, name) % self.world_size:
                raise ValueError(f"world size {self.world_size} does not divide {name} = "
                                 f"{getattr(self, name)}")


def gemm_shape(site: str, shape: Deployment) -> tuple[int, int, int]:
    """``(M, K, N)`` of a GEMM site on one rank."""
    name = site.partition(".")[2]
    T, h, m, p = shape.tokens, shape.d_model, shape.d_mlp, shape.world_size
    shapes = {"qkv": (T, h, 3 * h // p), "proj": (T, h // p, h),
              "fc_in": (T, h, m // p), "fc_out": (T, m // p, h)}
    if name not in shapes:
        raise ValueError(f"{site!r} is not a GEMM site")
    return shapes[name]


def gemm_time(M: int, K: int, N: int, precision: str, hw: HardwareProfile) -> float:
    """Roofline time of one GEMM ({eq}`eq-ccq-roofline`)."""
    wbits, abits = gemm_bits(precision)
    flops = 2.0 * M * K * N
    moved = (M * K * abits + K * N * wbits) / 8 + 2.0 * M * N
    return hw.kernel_latency + max(flops / hw.rate(abits), moved / hw.hbm_bandwidth)


def comm_bytes(shape: Deployment, precision: str) -> float:
    """Bytes one rank sends in one all-reduce of a ``(tokens, d_model)`` partial sum."""
    bits = comm_bits(precision)
    T, h, p = shape.tokens, shape.d_model, shape.world_size
    if bits == 16:
        return 2 * (p - 1) / p * T * h * 2
    return (p - 1) * (T * h * bits / 8 + T * SCALE_BYTES)


def comm_time(shape: Deployment, precision: str, hw: HardwareProfile) -> float:
    """Latency plus bandwidth time of one all-reduce ({eq}`eq-ccq-comm`)."""
    p = shape.world_size
    steps = 2 * (p - 1) if comm_bits(precision) == 16 else p - 1
    return steps * hw.link_latency + comm_bytes(shape, precision) / hw.link_bandwidth


def conversion_time(shape: Deployment, comm_precision: str, consumer_precision: str | None,
                    hw: HardwareProfile, aligned: bool = True) -> float:
    """Extra time of a quantised all-reduce that is not precision-aligned ({eq}`eq-ccq-align`).

    Zero for float16 communication and, with the precision-aligned rewrite (``aligned=True``),
    when the communicated bits equal the consumer GEMM's activation bits; otherwise one quantise
    kernel (reads the float16 partial, writes the payload) and one dequantise-sum kernel (reads
    ``p`` payloads, writes float16). ``aligned=False`` is the ablation without the rewrite: every
    quantised message pays both kernels.
    """
    if not isinstance(aligned, bool):
        raise TypeError(f"aligned must be a bool, got {type(aligned).__name__}")
    bits = comm_bits(comm_precision)
    consumer_bits = 16 if consumer_precision is None else gemm_bits(consumer_precision)[1]
    if bits == 16 or (aligned and bits == consumer_bits):
        return 0.0
    T, h, p = shape.tokens, shape.d_model, shape.world_size
    payload = T * h * bits / 8 + T * SCALE_BYTES
    moved = 2 * T * h * 2 + (1 + p) * payload
    return 2 * hw.kernel_latency + moved / hw.hbm_bandwidth


def fixed_time(shape: Deployment, hw: HardwareProfile) -> float:
    """Time of the parts no site controls: causal attention scores and mixing, in FP16."""
    T, h, p = shape.tokens, shape.d_model, shape.world_size
    flops = 2 * 2 * T * T * (h // p) / 2  # QK^T and PV, half of the square is masked
    return shape.n_layers * (2 * hw.kernel_latency + flops / hw.fp16_flops)


def site_time(site: str, precision: str, shape: Deployment, hw: HardwareProfile) -> float:
    """Predicted time of one site at one precision (without alignment effects)."""
    if site_kind(site) == "gemm":
        return gemm_time(*gemm_shape(site, shape), precision, hw)
    return comm_time(shape, precision, hw)


def predicted_latency(config: dict[str, str], shape: Deployment, hw: HardwareProfile,
                      aligned: bool = True) -> float:
    """End-to-end predicted time of one forward pass of the sharded layers."""
    total = fixed_time(shape, hw)
    for site in site_names(shape.n_layers):
        total += site_time(site, config[site], shape, hw)
        if site_kind(site) == "comm":
            nxt = consumer(site, shape.n_layers)
            total += conversion_time(shape, config[site], None if nxt is None else config[nxt],
                                     hw, aligned)
    return total


def latency_breakdown(config: dict[str, str], shape: Deployment, hw: HardwareProfile,
                      aligned: bool = True) -> dict[str, float]:
    """Predicted seconds spent in GEMMs, collectives, conversions and fixed work."""
    parts = {"GEMM": 0.0, "communication": 0.0, "conversion": 0.0,
             "attention core": fixed_time(shape, hw)}
    for site in site_names(shape.n_layers):
        if site_kind(site) == "gemm":
            parts["GEMM"] += site_time(site, config[site], shape, hw)
        else:
            parts["communication"] += site_time(site, config[site], shape, hw)
            nxt = consumer(site, shape.n_layers)
            parts["conversion"] += conversion_time(shape, config[site],
                                                   None if nxt is None else config[nxt], hw,
                                                   aligned)
    return parts
