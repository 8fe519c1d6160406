"""GGUF tensors multiplied on their own blocks: decode, repack, and :class:`GGUFLinear`.

Owner: ``metrale_core.layers``; ``linear.build_linear`` (format ``auto``) builds a
:class:`GGUFLinear` for a GGUF tensor of a type in :data:`GGUF_KINDS`, and
:class:`QuantEmbedding` for a quantized token table.

Every supported GGML type is, per output channel and sub-block of ``S`` (32 or 16) weights,
``W = d * q + m`` with small integer codes ``q`` and float32 ``d``/``m`` that are *exact*
products of the file's fp16 scales and its sub-block scales (:func:`decode`; MXFP4's scale is
its E8M0 byte, ``2^(e - 128)`` times codes that are the e2m1 values doubled, as llama.cpp's).  The C kernel
(``kernels/cpu/gguf_qmatmul.c``, AVX2 and AVX512-VNNI, the same bits; the file header has the
record layout) multiplies by those codes with activations quantized per block of 32, to 15 bits
(``255 * hi + lo``, two int8 dot products: twice llama.cpp's integer work, the same weight bytes)
or to int8 as llama.cpp's Q8_0 -- one :class:`ActivationPrecision` per model, which the load
chooses by measuring both (``metrale_core.loading.activation_probe``): int8 flips near-tied greedy
choices on some models, e.g. the embedded SmolLM2's answer to "What is the capital of France?".
(llama.cpp quantizes activations per 256 for K-quants; per 32 is finer.)  Q2_K and Q3_K have no
kernel of their own: their codes (2-3 bits, scales per 16) are repacked into the 8-bit, per-16
kind, exactly but at 1.25-1.5 bytes per weight instead of 0.33-0.43 (logged as a WARNING); so are
MXFP4's (e2m1 codes, not affine: 1.125 bytes per weight instead of 0.53, also logged).

Where the C kernel does not run (no AVX2, no compiler, ``METRALE_KERNELS=native``) the same
codes are multiplied by torch (:func:`fallback_matmul`): exact integer dot products per
sub-block in float32 matmuls, then the scales -- the same maths in another order of float sums.

Invariants:
- Repacking goes tensor by tensor and row chunk by row chunk (:data:`REPACK_ROWS` rows, up to
  :data:`REPACK_THREADS` chunks at once on as many threads), so the peak extra memory of a load is
  a few chunks' temporaries, never a dequantized matrix; the records are the same in any order.
- A row's result depends only on that row (the kernel splits channel tiles between threads and
  fixes each row's order of sums): batch-invariant by construction.
- A projection built ``lazy`` (an MoE's routed experts) keeps views of the mapped file until its
  first call repacks them (through the repack cache: file-backed records, evictable), so loading
  reads no expert and only the experts the router picks are ever paged in; the records, and so
  the results, are those of an eager repack.
- ``decode(...)`` reproduces ``gguf.quants.dequantize`` exactly: ``codes * d + m`` equals it in
  float32 (tested per type).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any

import numpy as np
import torch
from attrs import define, field, frozen
from loguru import logger

from metrale_core.kernels import cpu_layer_library
from metrale_core.layers import repack_cache
from metrale_core.layers.cpu_qmatmul import PACKAGE  # the C library of metrale_core.layers

__all__ = [
    "GGUF_KINDS",
    "REPACK_ROWS",
    "GGUFLinear",
    "PendingRepack",
    "QuantEmbedding",
    "Repacked",
    "decode",
    "dequantize_rows",
    "fallback_matmul",
    "gguf_kernel",
    "gguf_linear",
    "kind_of",
    "pack",
    "reference",
    "repack",
]

QK = 32
TILE = 16
#: Rows decoded and packed at a time while loading (bounds the load's temporaries).
REPACK_ROWS = 1024
#: Chunks repacked at once, on as many threads (at most one per core).
REPACK_THREADS = 4

# kinds of the C kernel: (code bits, sub-block size, has m) -- the enum of gguf_qmatmul.c
K_U4_32_M, K_S8_32, K_S8_32_M, K_S8_16, K_S8_16_M = range(5)
_KIND_SHAPE = {
    K_U4_32_M: (4, 32, True),
    K_S8_32: (8, 32, False),
    K_S8_32_M: (8, 32, True),
    K_S8_16: (8, 16, False),
    K_S8_16_M: (8, 16, True),
}
#: GGML type -> (kernel kind, elements per block, bytes per block).
GGUF_KINDS: dict[str, tuple[int, int, int]] = {
    "Q4_0": (K_U4_32_M, 32, 18),
    "Q4_1": (K_U4_32_M, 32, 20),
    "Q5_0": (K_S8_32, 32, 22),
    "Q5_1": (K_S8_32_M, 32, 24),
    "Q8_0": (K_S8_32, 32, 34),
    "Q4_K": (K_U4_32_M, 256, 144),
    "Q5_K": (K_S8_32_M, 256, 176),
    "Q6_K": (K_S8_16, 256, 210),
    "Q2_K": (K_S8_16_M, 256, 84),
    "Q3_K": (K_S8_16, 256, 110),
    "IQ4_NL": (K_S8_32, 32, 18),
    "IQ4_XS": (K_S8_32, 256, 136),
    "MXFP4": (K_S8_32, 32, 17),
}
#: Types repacked into a wider kind than their own bits (WARNING at load, with the memory cost).
_WIDENED = {"Q2_K": 84 / 256, "Q3_K": 110 / 256, "MXFP4": 17 / 32}
_IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)
#: MXFP4's e2m1 values doubled (llama.cpp's ``kvalues_mxfp4``): code ``c`` is ``_MXFP4_VALUES[c] / 2``.
_MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)


def kind_of(quant_type: str) -> int | None:
    """The kernel kind of GGML type ``quant_type`` (None: not a block type this module takes)."""
    entry = GGUF_KINDS.get(quant_type)
    return None if entry is None else entry[0]


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view("<f2")[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """``[..., 16]`` bytes -> ``[..., 32]`` codes: low nibbles first, then high (the legacy order)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes of packed 6-bit scales and mins -> ``[..., 8]`` each."""
    d, m, md = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _bits_of(x: np.ndarray, count: int) -> np.ndarray:
    """``[..., n]`` -> ``[..., count, n]``: bit ``j`` of every element."""
    return (x[..., None, :] >> np.arange(count, dtype=x.dtype).reshape(count, 1)) & 1


def decode(blocks: np.ndarray, quant_type: str) -> tuple[int, np.ndarray, np.ndarray, np.ndarray | None]:
    """``(kind, codes, d, m)`` of ``blocks`` ``[N, nblocks, type_size]`` (uint8) of ``quant_type``:
    codes ``[N, K]`` (uint8 for 4-bit kinds, int8 else), ``d``/``m`` ``[N, K / S]`` float32
    (``m`` None for symmetric kinds) with ``W = d * codes + m`` per sub-block of ``S``."""
    kind, _, _ = GGUF_KINDS[quant_type]
    n, nblk, _ = blocks.shape
    b = blocks
    m = None
    if quant_type in ("Q4_0", "Q4_1", "IQ4_NL"):
        d = _f16(b[..., 0:2])
        off = 4 if quant_type == "Q4_1" else 2
        q = _nibbles(b[..., off : off + 16])
        if quant_type == "IQ4_NL":
            q = _IQ4_VALUES[q]
        else:
            m = _f16(b[..., 2:4]) if quant_type == "Q4_1" else np.float32(-8.0) * d
    elif quant_type in ("Q5_0", "Q5_1"):
        d = _f16(b[..., 0:2])
        off = 4 if quant_type == "Q5_1" else 2
        high = np.unpackbits(b[..., off : off + 4], axis=-1, bitorder="little")  # bit j of the LE u32
        q = _nibbles(b[..., off + 4 : off + 20])
        q |= high << 4
        if quant_type == "Q5_1":
            m = _f16(b[..., 2:4])
        else:
            q -= 16  # 0..31 -> -16..15, wrapping in uint8: the int8 view is the code
            q = q.view(np.int8)
    elif quant_type == "Q8_0":
        d = _f16(b[..., 0:2])
        q = b[..., 2:34].view(np.int8)
    elif quant_type == "MXFP4":  # E8M0 byte e, 16 B of e2m1 nibbles: 2^(e-128) * doubled value
        d = np.ldexp(np.float32(1.0), b[..., 0].astype(np.int32) - 128).astype(np.float32)
        q = _MXFP4_VALUES[_nibbles(b[..., 1:17])]
    elif quant_type in ("Q4_K", "Q5_K"):
        dd, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
        sc, mn = _k_scales(b[..., 4:16])
        d, m = dd[..., None] * sc, -(dmin[..., None] * mn)  # [N, nblk, 8]
        qs = b[..., 16:144] if quant_type == "Q4_K" else b[..., 48:176]
        qs = qs.reshape(n, nblk, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 1, 2, 1)
        q = (qs & 0x0F).reshape(n, nblk, 8, 32)
        if quant_type == "Q5_K":
            q = q | (_bits_of(b[..., 16:48], 8) << 4)
    elif quant_type == "Q6_K":
        ql, qh = b[..., 0:128], b[..., 128:192]
        sc = b[..., 192:208].view(np.int8).astype(np.float32)
        d = _f16(b[..., 208:210])[..., None] * sc  # [N, nblk, 16]
        lo = (ql.reshape(n, nblk, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 1, 2, 1)) & 0x0F
        hi = (qh.reshape(n, nblk, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 1, 4, 1)) & 3
        q = (lo.reshape(n, nblk, 8, 32) | (hi.reshape(n, nblk, 8, 32) << 4)).astype(np.int8) - np.int8(32)
    elif quant_type == "Q2_K":
        scales, qs = b[..., 0:16], b[..., 16:80]
        dd, dmin = _f16(b[..., 80:82]), _f16(b[..., 82:84])
        d = dd[..., None] * (scales & 0x0F).astype(np.float32)
        m = -(dmin[..., None] * (scales >> 4).astype(np.float32))
        q = (qs.reshape(n, nblk, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 1, 4, 1)) & 3
        q = q.astype(np.int8)
    elif quant_type == "Q3_K":
        hmask, qs, scales = b[..., 0:32], b[..., 32:96], b[..., 96:108]
        dd = _f16(b[..., 108:110])
        low = (scales[..., 0:8, None] >> np.array([0, 4], dtype=np.uint8)).transpose(0, 1, 3, 2).reshape(n, nblk, 16)
        high = (scales[..., 8:12, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)).transpose(0, 1, 3, 2)
        sc = ((low & 0x0F) | ((high.reshape(n, nblk, 16) & 3) << 4)).astype(np.int8) - np.int8(32)
        d = dd[..., None] * sc.astype(np.float32)
        ql = (qs.reshape(n, nblk, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 1, 4, 1)) & 3
        qh = _bits_of(hmask, 8) ^ 1  # [N, nblk, 8, 32]
        q = ql.reshape(n, nblk, 8, 32).astype(np.int8) - (qh << 2).astype(np.int8)
    elif quant_type == "IQ4_XS":
        dd = _f16(b[..., 0:2])
        sh = np.ascontiguousarray(b[..., 2:4]).view("<u2")[..., 0]
        sl = b[..., 4:8]
        lo = (sl[..., None] >> np.array([0, 4], dtype=np.uint8)).reshape(n, nblk, 8) & 0x0F
        hi = ((sh[..., None] >> np.arange(0, 16, 2, dtype=np.uint16)) & 3).astype(np.uint8)
        d = dd[..., None] * ((lo | (hi << 4)).astype(np.float32) - 32.0)
        q = _IQ4_VALUES[_nibbles(b[..., 8:136].reshape(n, nblk, 8, 16))]
    else:
        raise ValueError(f"GGML type {quant_type} has no block kernel")
    k = q.size // n
    _, sub, has_m = _KIND_SHAPE[kind]
    d = np.asarray(d, dtype=np.float32).reshape(n, k // sub)
    if has_m:
        m = (
            np.broadcast_to(np.asarray(m, dtype=np.float32).reshape(n, -1), d.shape)
            if m is not None
            else np.zeros_like(d)
        )
        m = np.asarray(m, dtype=np.float32).reshape(n, k // sub)
    else:
        m = None
    codes = np.ascontiguousarray(q.reshape(n, k)).astype(np.uint8 if kind == K_U4_32_M else np.int8, copy=False)
    return kind, codes, d, m


def pack(
    kind: int, codes: np.ndarray, d: np.ndarray, m: np.ndarray | None, out: np.ndarray | None = None
) -> np.ndarray:
    """The kernel's records (``uint8``, see ``gguf_qmatmul.c``) of ``decode``'s output, written
    into ``out`` (``records_nbytes`` uint8) when given."""
    bits, sub, has_m = _KIND_SHAPE[kind]
    n, k = codes.shape
    t, nb, subs = n // TILE, k // QK, QK // sub
    c = codes.view(np.uint8).reshape(t, TILE, nb, 8, 4).transpose(0, 2, 3, 1, 4)  # [T, nb, g, c, i]
    code_bytes = QK * bits // 8 * TILE
    scale_bytes = subs * TILE * 4
    shape = (t, nb, code_bytes + scale_bytes * (1 + has_m))
    out = np.empty(shape, dtype=np.uint8) if out is None else out.reshape(shape)
    if bits == 4:
        packed = out[..., :code_bytes].reshape(t, nb, 4, TILE, 4)
        np.left_shift(c[:, :, 4:], 4, out=packed)
        packed |= c[:, :, :4]
    else:
        out[..., :code_bytes].reshape(t, nb, 8, TILE, 4)[...] = c
    for i, s in enumerate((d, m) if has_m else (d,)):
        s = np.asarray(s, dtype=np.float32).reshape(t, TILE, nb, subs).transpose(0, 2, 3, 1)
        start = code_bytes + i * scale_bytes
        out[..., start : start + scale_bytes].view(np.float32).reshape(t, nb, subs, TILE)[...] = s
    return out.reshape(t, -1)


def records_nbytes(kind: int, out_features: int, in_features: int) -> int:
    """Bytes of :func:`pack`'s records for an ``[out_features, in_features]`` matrix of ``kind``."""
    bits, sub, has_m = _KIND_SHAPE[kind]
    return out_features * (in_features // QK) * (QK * bits // 8 + (QK // sub) * 4 * (1 + has_m))


def gguf_kernel() -> ctypes.CDLL | None:
    """The package's C library when the CPU path is chosen for :class:`GGUFLinear`, else None."""
    return cpu_layer_library("GGUFLinear", PACKAGE)


@frozen
class Repacked:
    """One matrix in a kernel kind: ``records`` (the C layout) or, for the torch path, ``codes``
    ``[N, K]`` int8/uint8 and ``d``/``m`` ``[N, K / S]`` (both kept only where that path runs)."""

    kind: int
    out_features: int
    in_features: int
    records: torch.Tensor | None = None
    codes: torch.Tensor | None = None
    d: torch.Tensor | None = None
    m: torch.Tensor | None = None


def _blocks(raw: Any, rows: slice) -> np.ndarray:
    n, k = raw.shape
    _, per_block, size = GGUF_KINDS[raw.quant_type]
    data = np.asarray(raw.data).reshape(n, -1)[rows]
    return data.view(np.uint8).reshape(data.shape[0], k // per_block, size)


def repack(raws: Sequence[Any], native: bool) -> Repacked:
    """The fused matrix of GGUF tensors ``raws`` (one GGML type, stacked along rows), repacked
    chunk by chunk: C records when ``native``, else codes and scales for :func:`fallback_matmul`."""
    quant_type = raws[0].quant_type
    kind = kind_of(quant_type)
    if kind is None or any(r.quant_type != quant_type for r in raws):
        raise ValueError(f"cannot repack types {[r.quant_type for r in raws]} into one block matrix")
    in_features = int(raws[0].shape[1])
    out_features = sum(int(r.shape[0]) for r in raws)
    if quant_type in _WIDENED:
        _warn_widened(quant_type, kind)
    jobs = []
    row0 = 0  # the raw's first row in the fused matrix
    for raw in raws:
        jobs += [(raw, start, row0 + start) for start in range(0, int(raw.shape[0]), REPACK_ROWS)]
        row0 += int(raw.shape[0])
    if native:
        nbytes = records_nbytes(kind, out_features, in_features)
        key = repack_cache.cache_key([getattr(r, "source", None) for r in raws], kind, (TILE, QK))
        cached = repack_cache.load(key, nbytes)
        if cached is not None:
            return Repacked(kind, out_features, in_features, records=torch.from_numpy(cached))
        reservation = repack_cache.reserve(key, nbytes)
        flat, per_row = reservation.records, nbytes // out_features

        def into_records(job: tuple[Any, int, int]) -> None:
            raw, start, row = job
            _, codes, d, m = decode(_blocks(raw, slice(start, start + REPACK_ROWS)), quant_type)
            pack(kind, codes, d, m, out=flat[row * per_row : (row + codes.shape[0]) * per_row])

        try:
            list(_repack_pool().map(into_records, jobs))  # numpy releases the GIL: chunks side by side
        except BaseException:
            reservation.discard()
            raise
        reservation.commit()
        return Repacked(kind, out_features, in_features, records=torch.from_numpy(flat))

    def one(job: tuple[Any, int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        raw, start, _ = job
        _, codes, d, m = decode(_blocks(raw, slice(start, start + REPACK_ROWS)), quant_type)
        return codes, d, m

    chunks = list(_repack_pool().map(one, jobs))
    code_parts, d_parts, m_parts = ([a for part in chunks if (a := part[i]) is not None] for i in range(3))
    return Repacked(
        kind,
        out_features,
        in_features,
        codes=torch.from_numpy(np.concatenate(code_parts)),
        d=torch.from_numpy(np.concatenate(d_parts)),
        m=torch.from_numpy(np.concatenate(m_parts)) if m_parts else None,
    )


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _repack_pool() -> ThreadPoolExecutor:
    """The threads repacking chunks (one per core, at most :data:`REPACK_THREADS`), made once."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(min(REPACK_THREADS, os.cpu_count() or 1), thread_name_prefix="metrale-repack")
        return _pool


_warned: set[str] = set()


def _warn_widened(quant_type: str, kind: int) -> None:
    if quant_type in _warned:
        return
    _warned.add(quant_type)
    bits, sub, has_m = _KIND_SHAPE[kind]
    per_weight = (bits * 32 // 8 + 4 * (32 // sub) * (1 + has_m)) / 32
    logger.warning(
        "{} tensors have no kernel of their own: repacked once at load into 8-bit codes with "
        "per-{} float32 scales (exact values, but {:.2f} bytes per weight instead of {:.2f}: "
        "~{:.1f}x the memory and the bandwidth per token of the file's own blocks)",
        quant_type,
        sub,
        per_weight,
        _WIDENED[quant_type],
        per_weight / _WIDENED[quant_type],
    )


# --- activations and the torch path --------------------------------------------------------------


def quantize_activations(
    x: torch.Tensor, sub: int = QK, fine: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(hi, lo, da, sa)`` exactly as the C kernel computes them: codes ``[R, K]`` with the
    activation ``x ~ da * (255 * hi + lo)`` (``fine``; else ``da * hi`` and ``lo`` zero),
    ``da`` ``[R, K/32]`` and ``sa = da * sum(codes)`` ``[R, K/sub]``."""
    xb = x.float().reshape(x.shape[0], -1, QK)
    amax = xb.abs().amax(-1)
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    t = xb * inv[..., None]
    hi = torch.round(t)
    if fine:
        lo = (torch.round(t * 255.0) - 255.0 * hi).clamp(-127, 127)
        code = 255.0 * hi + lo
        da = amax / 32385.0
    else:
        lo = torch.zeros_like(hi)
        code = hi
        da = amax / 127.0
    sums = code.reshape(x.shape[0], -1, sub).sum(-1)
    return hi.reshape(x.shape), lo.reshape(x.shape), da, da.repeat_interleave(QK // sub, dim=1) * sums


def reference(
    x: torch.Tensor, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, fine: bool = True
) -> torch.Tensor:
    """What the kernel computes, in float64: per sub-block integer dots, scaled, plus the m term."""
    n, k = codes.shape
    sub = k // d.shape[1]
    hi, lo, da, sa = quantize_activations(x, sub, fine)
    q = 255.0 * hi.double() + lo.double() if fine else hi.double()
    rows = q.shape[0]
    dots = torch.einsum("rbs,nbs->rnb", q.reshape(rows, -1, sub), codes.double().reshape(n, -1, sub))
    da_sub = da.double().repeat_interleave(QK // sub, dim=1)
    y = (dots * d.double()[None] * da_sub[:, None]).sum(-1)
    if m is not None:
        y = y + (m.double()[None] * sa.double()[:, None]).sum(-1)
    return y


def fallback_matmul(x: torch.Tensor, w: Repacked, fine: bool = True) -> torch.Tensor:
    """``x @ W.T`` from codes and scales by torch (the path without the C kernel), float32: the
    integer dots are float32 matmuls of int8-sized values (exact), combined in float64."""
    assert w.codes is not None and w.d is not None, "a Repacked for the torch path holds codes and scales"
    scales = w.d
    n, k = w.codes.shape
    sub = k // scales.shape[1]
    hi, lo, da, sa = quantize_activations(x, sub, fine)
    rows = hi.shape[0]
    da_sub = da.double().repeat_interleave(QK // sub, dim=1)
    codes = w.codes.float().reshape(n, -1, sub).transpose(0, 1)  # [ns, N, S]
    step = max(1, (1 << 22) // max(1, n * (k // sub)))
    out = []

    def dots(q: torch.Tensor) -> torch.Tensor:  # exact integers [r, N, ns]
        return torch.bmm(q.reshape(-1, k // sub, sub).transpose(0, 1), codes.transpose(1, 2)).permute(1, 2, 0)

    for r0 in range(0, rows, step):
        sl = slice(r0, r0 + step)
        dot = dots(hi[sl]).double()
        if fine:
            dot = 255.0 * dot + dots(lo[sl]).double()
        y = (dot * scales.double()[None] * da_sub[sl, None]).sum(-1)
        if w.m is not None:
            y = y + (w.m.double()[None] * sa[sl, None].double()).sum(-1)
        out.append(y.float())
    return torch.cat(out)


_local = threading.local()
#: ``mq_gguf_scratch_bytes(rows, k)`` by ``(rows, k)``: a pure function of its arguments, asked per
#: projection per step (a ctypes round trip each, otherwise).
_scratch_sizes: dict[tuple[int, int], int] = {}


def _scratch(lib: ctypes.CDLL, rows: int, k: int) -> int:
    """This thread's scratch buffer for an ``[rows, k]`` input (grown on demand)."""
    nbytes = _scratch_sizes.get((rows, k))
    if nbytes is None:
        if len(_scratch_sizes) > 4096:
            _scratch_sizes.clear()
        nbytes = _scratch_sizes[(rows, k)] = lib.mq_gguf_scratch_bytes(rows, k)
    buf = getattr(_local, "buf", None)
    if buf is None or buf.numel() < nbytes:
        buf = _local.buf = torch.empty(max(nbytes, 1 << 16), dtype=torch.uint8)
    return buf.data_ptr()


def native_matmul(
    lib: ctypes.CDLL, x: torch.Tensor, w: Repacked, fine: bool = True, threads: int | None = None
) -> torch.Tensor:
    """``x [R, K] (float32) @ W.T`` through ``mq_gguf_linear``."""
    assert w.records is not None, "a Repacked for the C kernel holds its records"
    x = x.contiguous()
    rows, k = x.shape
    y = torch.empty(rows, w.out_features, dtype=torch.float32)
    rc = lib.mq_gguf_linear(
        x.data_ptr(),
        rows,
        k,
        w.records.data_ptr(),
        w.out_features,
        w.kind,
        int(fine),
        y.data_ptr(),
        _scratch(lib, rows, k),
        threads or torch.get_num_threads(),
    )
    if rc != 0:
        raise ValueError(f"mq_gguf_linear cannot take x {list(x.shape)} with {w.out_features} outputs")
    return y


@define
class ActivationPrecision:
    """How the :class:`GGUFLinear` s of one model quantize their activations, shared by all of
    them so one decision at load (``metrale_core.loading.activation_probe``) sets the whole model:
    ``fine`` 15-bit (``255 * hi + lo``), else int8 as llama.cpp (half the integer work).
    ``members`` counts the projections that read it, ``native`` whether they all run the C kernel."""

    fine: bool = True
    members: int = 0
    native: bool = True


_SCOPE: ContextVar[ActivationPrecision | None] = ContextVar("metrale_activation_precision", default=None)


@contextlib.contextmanager
def activation_precision_scope() -> Iterator[ActivationPrecision]:
    """A fresh :class:`ActivationPrecision` that every :func:`gguf_linear` built inside the block
    shares (the loader wraps one model's construction in it)."""
    cell = ActivationPrecision()
    token = _SCOPE.set(cell)
    try:
        yield cell
    finally:
        _SCOPE.reset(token)


@frozen
class PendingRepack:
    """GGUF tensors not repacked yet (views of the mapped file): :class:`GGUFLinear` repacks them
    on its first call -- an MoE expert is paged in when the router first picks it."""

    raws: tuple[Any, ...]
    native: bool
    out_features: int


#: Serialises first-use repacks (a projection is repacked once, whichever thread calls it first).
_FIRST_USE = threading.Lock()


@frozen
class GGUFLinear:
    """A projection kept as GGUF blocks (any type of :data:`GGUF_KINDS`), multiplied by the C
    kernel (``kernel`` set) or by torch (:func:`fallback_matmul`); a :class:`PendingRepack`
    weight is repacked on the first call (:meth:`repacked`), the same records as at load."""

    weight: Repacked | PendingRepack
    kernel: Any = field(default=None, repr=False)
    bias: torch.Tensor | None = None
    precision: ActivationPrecision = field(factory=ActivationPrecision, repr=False)

    @property
    def out_features(self) -> int:
        return self.weight.out_features

    @property
    def fine(self) -> bool:
        """15-bit activations (``255 * hi + lo``); False: int8 as llama.cpp."""
        return self.precision.fine

    @property
    def pending(self) -> bool:
        """Not repacked yet (built lazily and never called)."""
        return isinstance(self.weight, PendingRepack)

    def repacked(self) -> Repacked:
        """The weight, repacked now if it is still pending."""
        w = self.weight
        if isinstance(w, PendingRepack):
            with _FIRST_USE:
                w = self.weight
                if isinstance(w, PendingRepack):
                    w = repack(w.raws, native=w.native)
                    object.__setattr__(self, "weight", w)  # the one change of a frozen record
        return w

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight if isinstance(self.weight, Repacked) else self.repacked()
        flat = x.dim() == 2 and x.dtype is torch.float32  # the decoders' case: no reshape, no casts
        x2 = x if flat else x.reshape(-1, x.shape[-1]).float()
        if self.kernel is not None:
            y = native_matmul(self.kernel, x2, w, self.fine)
        else:
            y = fallback_matmul(x2, w, self.fine)
        if not flat:
            y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


def gguf_linear(
    raws: Sequence[Any],
    bias: torch.Tensor | None = None,
    precision: ActivationPrecision | None = None,
    *,
    lazy: bool = False,
) -> GGUFLinear:
    """The :class:`GGUFLinear` of GGUF tensors ``raws`` (fused along rows; one GGML type),
    reading ``precision`` (default: the enclosing :func:`activation_precision_scope`'s, else
    its own, 15-bit); ``lazy``: repacked on its first call, not now (its pages of the mapped
    file are read then)."""
    lib = gguf_kernel()
    n = sum(int(r.shape[0]) for r in raws)
    if lib is not None and (n % TILE or int(raws[0].shape[1]) % QK):
        lib = None
    cell = precision or _SCOPE.get() or ActivationPrecision()
    cell.members += 1
    cell.native = cell.native and lib is not None
    native = lib is not None
    weight = PendingRepack(tuple(raws), native, n) if lazy else repack(raws, native=native)
    return GGUFLinear(weight, lib, bias, cell)


# --- token tables --------------------------------------------------------------------------------


def dequantize_rows(raw: Any, ids: torch.Tensor) -> np.ndarray:
    """Rows ``ids`` of GGUF tensor ``raw`` dequantized to float32 (``gguf.quants`` decodes them)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    data = np.asarray(raw.data).reshape(int(raw.shape[0]), -1)[ids.cpu().numpy()]
    return dequantize(data, GGMLQuantizationType[raw.quant_type]).reshape(len(ids), int(raw.shape[1]))


@frozen
class QuantEmbedding:
    """A quantized token table read in place (the memory-mapped GGUF rows): ``table[ids]``
    dequantizes only the rows asked for, so no float copy of the table is kept."""

    raw: Any
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return torch.Size(tuple(int(s) for s in self.raw.shape))

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        uniq, inverse = torch.unique(flat, return_inverse=True)
        rows = torch.from_numpy(dequantize_rows(self.raw, uniq)).to(self.dtype)
        return rows[inverse].reshape(*ids.shape, rows.shape[-1])
