"""GGUF's block formats as the C kernel's codes and scales: decode, pack, and the maths oracle.

Owner: ``metrale_core.layers``; :mod:`metrale_core.layers.formats.gguf_repack` turns GGUF tensors
into records with these functions and :mod:`metrale_core.layers.formats.gguf_linear` multiplies
by them.

Every supported GGML type is, per output channel and sub-block of ``S`` (32 or 16) weights,
``W = d * q + m`` with small integer codes ``q`` and float32 ``d``/``m`` that are *exact*
products of the file's fp16 scales and its sub-block scales (:func:`decode`; MXFP4's scale is
its E8M0 byte, ``2^(e - 128)`` times codes that are the e2m1 values doubled, as llama.cpp's).
The C kernel (``kernels/cpu/gguf_qmatmul.c``; the file header has the record layout that
:func:`pack` writes) multiplies by those codes with activations quantized per block of 32
(:func:`quantize_activations`), to 15 bits (``255 * hi + lo``) or to int8 as llama.cpp's Q8_0.
Q2_K and Q3_K have no kernel kind of their own: their codes are decoded into the 8-bit, per-16
kind, exactly; MXFP4's (e2m1 codes, not affine) into the 8-bit per-32 kind.

Invariants:
- ``decode(...)`` reproduces ``gguf.quants.dequantize`` exactly: ``codes * d + m`` equals it in
  float32 (tested per type).
- :func:`reference` is what the kernel computes, in float64 (the oracle of its tests).
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = [
    "GGUF_KINDS",
    "KIND_SHAPE",
    "QK",
    "TILE",
    "WIDENED",
    "decode",
    "kind_of",
    "pack",
    "quantize_activations",
    "records_nbytes",
    "reference",
]

QK = 32
TILE = 16
# kinds of the C kernel: (code bits, sub-block size, has m) -- the enum of gguf_qmatmul.c
K_U4_32_M, K_S8_32, K_S8_32_M, K_S8_16, K_S8_16_M = range(5)
KIND_SHAPE = {
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
WIDENED = {"Q2_K": 84 / 256, "Q3_K": 110 / 256, "MXFP4": 17 / 32}
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
    _, sub, has_m = KIND_SHAPE[kind]
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
    bits, sub, has_m = KIND_SHAPE[kind]
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
    bits, sub, has_m = KIND_SHAPE[kind]
    return out_features * (in_features // QK) * (QK * bits // 8 + (QK // sub) * 4 * (1 + has_m))


# --- activations ---------------------------------------------------------------------------------


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
