"""Dequantizers for GGML tensor encodings: raw GGUF bytes -> float32 numpy arrays.

Owner: the GGUF weight store (``gguf_store``) and any later fused-kernel code that needs a
reference dequantization.

Our own vectorised numpy code covers F32, F16, BF16, Q8_0, Q4_0, Q4_1 (the types of the
SmolLM2 file and of most small llama.cpp conversions) and MXFP4 (gpt-oss's experts).  Every
other type the ``gguf`` package knows (Q4_K, Q6_K, Q5_0, ...) goes through ``gguf.quants.dequantize``.

Invariants:
- ``dequantize`` never loops over blocks in Python and never writes into ``raw``; it returns a new,
  C-contiguous float32 array of exactly ``shape`` (numpy order, slowest dimension first).
- Block layouts (all little-endian, 32 elements per block):
  Q8_0 = f16 d, 32 x int8 q            -> d*q
  Q4_0 = f16 d, 16 B nibbles           -> d*(q-8)
  Q4_1 = f16 d, f16 m, 16 B nibbles    -> d*q + m
  MXFP4 = u8 e (E8M0), 16 B nibbles     -> 2^(e-127) * e2m1(q)   (e2m1: sign bit 3, then
          2 exponent bits and 1 mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6; OCP MX v1.0),
          computed as llama.cpp does, 2^(e-128) * 2 e2m1(q), so e = 255 is 2^128 (not NaN)
  where byte j holds element j in its low nibble and element j+16 in its high nibble.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

__all__ = ["NATIVE_TYPES", "dequantize", "qtype_of", "tensor_nbytes"]

#: Types decoded by our own code (everything else falls back to ``gguf.quants``).
NATIVE_TYPES = frozenset({"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "MXFP4"})


def qtype_of(qtype: str | int | GGMLQuantizationType) -> GGMLQuantizationType:
    """The ``GGMLQuantizationType`` for a name ("Q4_1"), a raw type number or the enum itself."""
    if isinstance(qtype, GGMLQuantizationType):
        return qtype
    if isinstance(qtype, str):
        try:
            return GGMLQuantizationType[qtype.upper()]
        except KeyError:
            raise ValueError(f"unknown GGML type name {qtype!r}") from None
    return GGMLQuantizationType(int(qtype))


def tensor_nbytes(qtype: str | int | GGMLQuantizationType, shape: Sequence[int]) -> int:
    """Bytes a tensor of ``shape`` (numpy order) occupies in ``qtype``; ValueError if rows do not fill blocks."""
    qt = qtype_of(qtype)
    block_size, type_size = GGML_QUANT_SIZES[qt]
    row = int(shape[-1]) if len(shape) else 1
    if row % block_size:
        raise ValueError(f"row length {row} is not a multiple of the {qt.name} block size {block_size}")
    return prod(int(s) for s in shape) // block_size * type_size


def dequantize(raw: np.ndarray, qtype: str | int | GGMLQuantizationType, shape: Sequence[int]) -> np.ndarray:
    """Decode ``raw`` (the tensor's bytes, any dtype/shape view of them) into float32 of ``shape``."""
    qt = qtype_of(qtype)
    shape = tuple(int(s) for s in shape)
    buf = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    expected = tensor_nbytes(qt, shape)
    if buf.size != expected:
        raise ValueError(f"{qt.name} tensor of shape {shape} needs {expected} bytes, got {buf.size}")
    decoder = _DECODERS.get(qt.name)
    if expected == 0:
        out = np.zeros(shape, dtype=np.float32)
    elif decoder is not None:
        out = decoder(buf)
    else:
        n_rows = prod(shape[:-1])
        rows = buf.reshape(n_rows, expected // n_rows)
        out = np.asarray(gguf_quants.dequantize(rows, qt), dtype=np.float32)
    return np.ascontiguousarray(out, dtype=np.float32).reshape(shape)


def _f32(buf: np.ndarray) -> np.ndarray:
    return buf.view("<f4").astype(np.float32)  # astype copies: the result never aliases the file


def _f16(buf: np.ndarray) -> np.ndarray:
    return buf.view("<f2").astype(np.float32)


def _bf16(buf: np.ndarray) -> np.ndarray:
    return (buf.view("<u2").astype(np.uint32) << 16).view(np.float32)


def _blocks(buf: np.ndarray, type_size: int) -> np.ndarray:
    return buf.reshape(-1, type_size)


def _half(blocks: np.ndarray, start: int) -> np.ndarray:
    """The f16 scale stored at byte ``start`` of each block, as a float32 column [n, 1]."""
    return blocks[:, start : start + 2].view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 16] packed bytes -> [n, 32] float32 codes (low nibbles are elements 0-15, high 16-31)."""
    out = np.empty((qs.shape[0], 32), dtype=np.float32)
    out[:, :16] = qs & np.uint8(0x0F)
    out[:, 16:] = qs >> np.uint8(4)
    return out


def _q8_0(buf: np.ndarray) -> np.ndarray:
    blocks = _blocks(buf, 34)
    out = blocks[:, 2:].view(np.int8).astype(np.float32)
    out *= _half(blocks, 0)
    return out


def _q4_0(buf: np.ndarray) -> np.ndarray:
    blocks = _blocks(buf, 18)
    out = _nibbles(blocks[:, 2:])
    out -= np.float32(8.0)
    out *= _half(blocks, 0)
    return out


def _q4_1(buf: np.ndarray) -> np.ndarray:
    blocks = _blocks(buf, 20)
    out = _nibbles(blocks[:, 4:])
    out *= _half(blocks, 0)
    out += _half(blocks, 2)
    return out


#: e2m1 codes 0..15 doubled (integers, so the products below are exact until the scale is applied).
_E2M1_DOUBLED = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.float32)


def _mxfp4(buf: np.ndarray) -> np.ndarray:
    blocks = _blocks(buf, 17)
    out = _E2M1_DOUBLED[_nibbles(blocks[:, 1:]).astype(np.uint8)]
    with np.errstate(over="ignore"):  # e = 255 times 1.5 or more: inf, as llama.cpp's float32
        out *= np.ldexp(np.float32(1.0), blocks[:, :1].astype(np.int32) - 128).astype(np.float32)
    return out


_DECODERS = {
    "F32": _f32,
    "F16": _f16,
    "BF16": _bf16,
    "Q8_0": _q8_0,
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "MXFP4": _mxfp4,
}
assert set(_DECODERS) == NATIVE_TYPES
