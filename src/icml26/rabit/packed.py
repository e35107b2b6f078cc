r"""Matmul-free inference with bit-packed signs, and the bytes a matrix-vector product moves.

A residual binary layer computes $y = \sum_p g_p \odot \bigl(B_p (h_p \odot x)\bigr)$ (chapter Eq.
`eq-matmul-free`). With $z = h_p \odot x$ and $M = (B_p + 1)/2 \in \{0, 1\}^{m \times n}$,

$$
B_p z = 2 M z - \mathbf 1^\top z ,
$$

and $M z$ only adds selected entries of $z$. We store $M$ packed, eight signs per byte, and
evaluate $Mz$ with a byte lookup table: for every group of eight inputs, the 256 possible subset
sums are built by additions (each new bit doubles the table), and each output sums one table entry
per byte. No weight is ever multiplied.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from icml26.rabit.binarize import BinaryPaths


def pack_signs(signs: np.ndarray) -> np.ndarray:
    """Pack $\\pm1$ signs ``(..., n)`` into bytes ``(..., ceil(n/8))``; bit $i$ of byte $k$ is
    input $8k + i$ (little bit order), 1 meaning $+1$."""
    signs = np.asarray(signs)
    if not np.isin(signs, (-1, 1)).all():
        raise ValueError("signs must be +1 or -1")
    return np.packbits(signs > 0, axis=-1, bitorder="little")


def subset_sum_table(z: np.ndarray) -> np.ndarray:
    """``table[k, v]`` = sum of ``z[8k + i]`` over the set bits $i$ of byte value $v$.

    Built with additions only: the entries with bit $i$ set are the entries without it plus
    ``z[8k + i]``.
    """
    groups = z.reshape(-1, 8)
    table = np.zeros((groups.shape[0], 256), dtype=z.dtype)
    for bit in range(8):
        low = 1 << bit
        table[:, low:2 * low] = table[:, :low] + groups[:, bit:bit + 1]
    return table


def packed_sign_matvec(packed: np.ndarray, z: np.ndarray) -> np.ndarray:
    """$Bz$ for packed signs ``(m, n/8)`` and ``z`` of length $n$ (a multiple of 8), additions
    only: $Bz = 2Mz - \\mathbf 1^\\top z$ with $Mz$ read from :func:`subset_sum_table`."""
    table = subset_sum_table(z)
    subset = table[np.arange(table.shape[0])[None, :], packed].sum(axis=1)
    return subset + subset - z.sum()


@dataclass(frozen=True)
class PackedResidualBinary:
    """A residual binary weight ready for matmul-free inference.

    ``packed`` is ``(P, m, ceil(n/8))`` uint8; the scales are float32 (stored as FP16 on a GPU).
    """

    packed: np.ndarray
    out_scales: np.ndarray
    in_scales: np.ndarray
    in_features: int

    @classmethod
    def from_paths(cls, paths: BinaryPaths) -> PackedResidualBinary:
        signs = paths.signs.detach().cpu().numpy()
        n = signs.shape[-1]
        padded = np.pad(signs, ((0, 0), (0, 0), (0, -n % 8)), constant_values=1)
        return cls(pack_signs(padded), paths.out_scales.detach().cpu().numpy().astype(np.float32),
                   paths.in_scales.detach().cpu().numpy().astype(np.float32), n)

    def matvec(self, x: np.ndarray) -> np.ndarray:
        """$y = \\sum_p g_p \\odot B_p (h_p \\odot x)$ (Eq. `eq-matmul-free`)."""
        x = np.asarray(x, dtype=np.float32)
        if x.shape != (self.in_features,):
            raise ValueError(f"x must have shape ({self.in_features},), got {x.shape}")
        y = np.zeros(self.packed.shape[1], dtype=np.float32)
        width = 8 * self.packed.shape[2]
        for packed, g, h in zip(self.packed, self.out_scales, self.in_scales, strict=True):
            z = np.zeros(width, dtype=np.float32)
            z[:self.in_features] = h * x
            y += g * packed_sign_matvec(packed, z)
        return y

    @property
    def nbytes(self) -> int:
        """Bytes stored, with the scales counted as FP16 (as a GPU kernel stores them)."""
        return self.packed.nbytes + 2 * (self.out_scales.size + self.in_scales.size)


def bits_per_weight(out_features: int, in_features: int, paths: int = 2,
                    scale_bits: int = 16) -> float:
    """$P + b_s P (m + n) / (mn)$: the sign bits plus the scale vectors, per weight (Eq.
    `eq-bits`)."""
    if min(out_features, in_features, paths, scale_bits) < 1:
        raise ValueError("sizes, paths and scale bits must be positive")
    return paths + scale_bits * paths * (out_features + in_features) / (out_features * in_features)


def median_time(fn, repeats: int = 15) -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


@dataclass(frozen=True)
class DecodeTraffic:
    """Bytes of weights read per generated token at batch 1, and the bandwidth-bound speed-up."""

    fp16_bytes: float
    quantized_bytes: float

    @property
    def speedup_bound(self) -> float:
        return self.fp16_bytes / self.quantized_bytes


def llama_decode_traffic(d_model: int = 4096, n_layers: int = 32, d_mlp: int = 11008,
                         vocab: int = 32000, paths: int = 2) -> DecodeTraffic:
    """Weight bytes per token for a Llama-style model in FP16 and with residual binary blocks.

    Each block has four $d \\times d$ attention projections and three $d \\times d_{mlp}$ MLP
    matrices (gate, up, down); the head stays FP16, as in the paper (the embedding table is not
    read in full: one row per token). At batch 1 decoding every weight is read once per token, so
    the ratio of bytes bounds the speed-up of a memory-bound kernel (defaults: Llama2-7B; the KV
    cache and activations are left out).
    """
    shapes = [(d_model, d_model)] * 4 + [(d_mlp, d_model)] * 2 + [(d_model, d_mlp)]
    block_weights = sum(m * n for m, n in shapes)
    block_binary = sum(m * n * bits_per_weight(m, n, paths) / 8 for m, n in shapes)
    fp16_head = 2 * vocab * d_model
    return DecodeTraffic(n_layers * 2 * block_weights + fp16_head,
                         n_layers * block_binary + fp16_head)
