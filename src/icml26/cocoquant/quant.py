r"""Precisions, symmetric quantisers and the packed wire format of quantised partial sums.

Every quantiser here is symmetric round-to-nearest, $Q_b(x) = s\,\operatorname{clip}(\operatorname
{round}(x / s), -q_b, q_b)$ with $q_b = 2^{b-1} - 1$ and $s = \max|x| / q_b$ over one group
({eq}`eq-ccq-quant`): a weight row (per output channel), a token's activations (per token), or a
token's partial sum on one rank (communication). Communication scales travel as float16, so
:func:`quantise_rows` rounds the scale to float16 before using it; sender and receiver then
dequantise with the very same number.

:func:`encode_partial` turns one rank's partial sum into the bytes it sends ({eq}`eq-ccq-bytes`):
float16 values (``c16``), int8 values plus float16 scales (``c8``) or two 4-bit values per byte
plus float16 scales (``c4``). :func:`decode_sum` dequantises the gathered payloads of all ranks and
adds them in rank order.
"""

from __future__ import annotations

import torch

GEMM_PRECISIONS = ("w16a16", "w8a8", "w4a8", "w4a4")
"""Options of a GEMM site: weight bits and activation bits (16 = the unquantised reference)."""

COMM_PRECISIONS = ("c16", "c8", "c4")
"""Options of a communication site: bits per communicated element of a partial sum."""

_GEMM_BITS = {"w16a16": (16, 16), "w8a8": (8, 8), "w4a8": (4, 8), "w4a4": (4, 4)}
_COMM_BITS = {"c16": 16, "c8": 8, "c4": 4}
SCALE_BYTES = 2
"""Bytes of one communicated scale (float16)."""


def gemm_bits(precision: str) -> tuple[int, int]:
    """``(weight bits, activation bits)`` of a GEMM precision such as ``"w8a8"``."""
    if precision not in _GEMM_BITS:
        raise ValueError(f"unknown GEMM precision {precision!r}; choose one of {GEMM_PRECISIONS}")
    return _GEMM_BITS[precision]


def comm_bits(precision: str) -> int:
    """Bits per element of a communication precision such as ``"c4"``."""
    if precision not in _COMM_BITS:
        raise ValueError(f"unknown communication precision {precision!r}; choose one of "
                         f"{COMM_PRECISIONS}")
    return _COMM_BITS[precision]


def _qmax(bits: int) -> int:
    if bits not in (2, 3, 4, 5, 6, 7, 8):
        raise ValueError(f"quantiser bits must be between 2 and 8, got {bits}")
    return 2 ** (bits - 1) - 1


def quantise_rows(x: torch.Tensor, bits: int,
                  scale_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer codes (int8) and per-row scales of $x$ along its last dimension ({eq}`eq-ccq-quant`).

    With ``scale_dtype`` (float16 for communication) the scale is rounded to that type first, so
    that the codes are computed with the scale the receiver will see. Such a scale is clamped to
    at least the type's smallest normal number (``torch.finfo(float16).tiny``, about 6.1e-5):
    without the clamp a row with ``max|x| < 127 * 6e-8`` gets a scale that rounds to 0 and
    infinite or NaN codes; with it, such a row is coded as (nearly) zeros, an error of at most
    half the clamped scale. Rows of zeros get scale 1. Non-finite inputs raise ``ValueError``.
    """
    qmax = _qmax(bits)
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        raise ValueError("cannot quantise NaN or infinite values")
    amax = x.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
    if scale_dtype is not None:
        if scale_dtype.is_floating_point:
            scale = scale.clamp_min(torch.finfo(scale_dtype).tiny)
        scale = scale.to(scale_dtype).to(x.dtype)
    codes = torch.clamp(torch.round(x / scale), -qmax, qmax).to(torch.int8)
    return codes, scale


def fake_quantise(x: torch.Tensor, bits: int) -> torch.Tensor:
    """$Q_b(x)$ with one scale per row (last dimension); ``bits = 16`` returns $x$ unchanged."""
    if bits == 16:
        return x
    codes, scale = quantise_rows(x, bits)
    return codes.to(x.dtype) * scale


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Pack int8 codes in $[-7, 7]$ two per byte (last dimension must be even) into uint8."""
    if codes.shape[-1] % 2:
        raise ValueError(f"int4 packing needs an even last dimension, got {codes.shape[-1]}")
    if codes.numel() and (codes.min() < -7 or codes.max() > 7):
        raise ValueError("int4 codes must lie in [-7, 7]")
    nibbles = (codes.to(torch.int16) + 8).to(torch.uint8)
    return nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_int4`: int8 codes, twice as many along the last dimension."""
    low = (packed & 0x0F).to(torch.int16) - 8
    high = (packed >> 4).to(torch.int16) - 8
    return torch.stack((low, high), dim=-1).flatten(-2).to(torch.int8)


def payload_bytes(rows: int, width: int, precision: str) -> int:
    """Bytes one rank sends for a ``(rows, width)`` partial sum ({eq}`eq-ccq-bytes`)."""
    bits = comm_bits(precision)
    if bits == 16:
        return rows * width * 2
    return rows * width * bits // 8 + rows * SCALE_BYTES


def encode_partial(partial: torch.Tensor, precision: str) -> torch.Tensor:
    """The bytes (a flat uint8 tensor) that carry one rank's ``(rows, width)`` partial sum."""
    bits = comm_bits(precision)
    if partial.ndim != 2:
        raise ValueError(f"partial sums must be 2-D (rows, width), got {tuple(partial.shape)}")
    if bits == 16:
        return partial.to(torch.float16).contiguous().view(torch.uint8).flatten()
    codes, scale = quantise_rows(partial, bits, scale_dtype=torch.float16)
    values = pack_int4(codes) if bits == 4 else codes.view(torch.uint8)
    scales = scale.to(torch.float16).contiguous().view(torch.uint8).flatten()
    return torch.cat((values.contiguous().flatten(), scales))


def decode_partial(payload: torch.Tensor, rows: int, width: int, precision: str,
                   dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Dequantise one payload of :func:`encode_partial` back to a ``(rows, width)`` tensor."""
    bits = comm_bits(precision)
    if payload.numel() != payload_bytes(rows, width, precision):
        raise ValueError(f"payload has {payload.numel()} bytes, expected "
                         f"{payload_bytes(rows, width, precision)}")
    if bits == 16:
        return payload.view(torch.float16).reshape(rows, width).to(dtype)
    value_bytes = rows * width * bits // 8
    values, scales = payload[:value_bytes], payload[value_bytes:]
    if bits == 4:
        codes = unpack_int4(values.reshape(rows, width // 2))
    else:
        codes = values.view(torch.int8).reshape(rows, width)
    scale = scales.view(torch.float16).reshape(rows, 1).to(dtype)
    return codes.to(dtype) * scale


def decode_sum(payloads: list[torch.Tensor], rows: int, width: int, precision: str,
               dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Dequantise every rank's payload and add them in rank order (the local all-reduce)."""
    total = decode_partial(payloads[0], rows, width, precision, dtype)
    for payload in payloads[1:]:
        total = total + decode_partial(payload, rows, width, precision, dtype)
    return total
