"""The block-quantized CPU matmul (``kernels/cpu/qmatmul.c``): pack weights for it and call it.

Owner: ``metrale_core.layers``; ``linear_kinds.BlockQuantLinear`` multiplies through :func:`qmatmul`,
``linear_kinds.Bf16Linear`` (the bf16 format's projections, the quantized formats' batch copy)
through :func:`qmatmul_bf16` (``kernels/cpu/bf16_matmul.c``: its AVX512-BF16 path where the CPU
has it, else its float32 FMA path, in both ISA builds; batch- and thread-invariant).  The C files
are part of the package's CPU library (:func:`metrale_core.kernels.cpu_library`), built with the
system C compiler on first use.

:func:`kernel` returns the library, or None -- and the weight formats keep torch's kernels --
where the CPU path is not chosen: the CPU lacks AVX2 (the library's AVX512-VNNI build runs where
the CPU has it, else its AVX2 build: ``qmatmul_avx2.c``), there is no compiler, the build fails, or
``METRALE_KERNELS=native`` (the op name in logs is ``BlockQuantLinear``).  The C signatures are
those of ``kernels/cpu/qmatmul.h``, bound when the library loads.

Maths (the C file's header has the layout): weights keep a GGUF block's ``W = d * q + m`` per
32 weights (4-bit or 8-bit unsigned codes, fp16 ``d``/``m``); activations are quantized per row
and block of 32 to int8 as llama.cpp's Q8_1 does.  :func:`reference` computes the same numbers
with torch ops, for tests.

Invariants: ``K % 32 == 0`` and ``N % 16 == 0``; inputs are float32; a packed buffer is a
contiguous tensor that outlives every call made with it.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np
import torch
from loguru import logger

from metrale_core.kernels.cpu import cpu_flags, cpu_isa
from metrale_core.kernels.custom_op import cpu_layer_library

__all__ = [
    "PACKAGE",
    "bf16_dot",
    "bf16_kernel",
    "kernel",
    "pack",
    "pack_bf16",
    "qmatmul",
    "qmatmul_bf16",
    "quantize_activations",
    "reference",
    "set_amx",
]

PACKAGE = "metrale_core.layers"
QK = 32
TILE = 16
_RECORD = {4: 320, 8: 576}
#: Libraries whose AMX path :func:`kernel` has asked for (once each).
_amx_asked: set = set()


def kernel() -> ctypes.CDLL | None:
    """The package's C library when the CPU path is chosen for the quantized matmul, else None.
    On CPUs with AMX-INT8 the first call also turns the AMX path on (see :func:`set_amx`)."""
    lib = cpu_layer_library("BlockQuantLinear", PACKAGE)
    if lib is not None and lib not in _amx_asked:  # signatures: bound from qmatmul.h at load
        _amx_asked.add(lib)
        amx = set_amx(lib, True)
        isa = cpu_isa(PACKAGE)
        path = (
            ("AMX-INT8 (calls of 12+ rows) and AVX512-VNNI" if amx else "AVX512-VNNI")
            if isa == "avx512"
            else "AVX2 (no AVX512-VNNI on this CPU, or METRALE_CPU_ISA=avx2)"
        )
        logger.info("BlockQuantLinear runs the C kernel: {}", path)
    return lib


def bf16_kernel() -> ctypes.CDLL | None:
    """The library for :func:`qmatmul_bf16` wherever :func:`kernel` runs (every ISA build
    multiplies bfloat16 weights), else None."""
    return kernel()


def bf16_dot(lib: ctypes.CDLL) -> bool:
    """Whether :func:`qmatmul_bf16` runs the AVX512-BF16 instructions (``mq_linear_bf16``: the AVX512
    build on a CPU with AVX512-BF16) rather than the float32 FMA path (``mq_linear_bf16_fma``)."""
    return cpu_isa(PACKAGE) == "avx512" and "avx512_bf16" in cpu_flags() and hasattr(lib, "mq_linear_bf16")


def set_amx(lib: ctypes.CDLL, on: bool) -> bool:
    """Use AMX-INT8 tiles for calls of 4 rows or more (``on``, where the CPU has AMX and the OS
    grants the tile state) or the AVX512-VNNI path only; returns whether AMX is used now.  Both
    paths compute the same sums (see the C file); not to be called while a matmul runs."""
    flags = cpu_flags()
    if on and not {"amx_tile", "amx_int8"} <= flags:
        on = False
    return bool(lib.mq_set_amx(int(on)))


def pack(codes: np.ndarray, d: np.ndarray, m: np.ndarray, bits: int) -> torch.Tensor:
    """The kernel's weight buffer for ``W[n, k] = d[n, k // 32] * codes[n, k] + m[n, k // 32]``.

    ``codes`` ``[N, K]`` holds unsigned codes below ``2**bits``; ``d``/``m`` ``[N, K/32]`` are
    rounded to fp16 (GGUF's own scale type, so GGUF values stay exact).  Raises ``ValueError`` for
    shapes the kernel cannot take or scales fp16 cannot hold.
    """
    n, k = codes.shape
    if bits not in _RECORD or n % TILE or k % QK:
        raise ValueError(f"cannot pack [{n}, {k}] at {bits} bits: needs N % {TILE} == 0 and K % {QK} == 0")
    if codes.min() < 0 or codes.max() >= 2**bits:
        raise ValueError(f"codes outside 0..{2**bits - 1}")
    scales = []
    for s in (d, m):
        with np.errstate(over="ignore"):
            h = np.asarray(s, dtype=np.float32).astype(np.float16)
        if not np.isfinite(h).all():
            raise ValueError("a block scale does not fit in fp16")
        scales.append(h.reshape(n // TILE, TILE, k // QK).transpose(0, 2, 1))  # [T, nb, 16]
    # [T, 16 (c), nb, 8 (g), 4 (i)] -> [T, nb, g, c, i]
    c = np.asarray(codes, dtype=np.uint8).reshape(n // TILE, TILE, k // QK, 8, 4).transpose(0, 2, 3, 1, 4)
    # 8-bit codes are stored signed (q - 128): the B operand of the AMX path
    c = c[:, :, :4] | (c[:, :, 4:] << 4) if bits == 4 else c ^ np.uint8(0x80)
    t, nb = n // TILE, k // QK
    records = np.concatenate(
        [
            np.ascontiguousarray(c).reshape(t, nb, -1),
            np.ascontiguousarray(scales[0]).view(np.uint8).reshape(t, nb, -1),
            np.ascontiguousarray(scales[1]).view(np.uint8).reshape(t, nb, -1),
        ],
        axis=-1,
    )
    assert records.shape[-1] == _RECORD[bits]
    return torch.from_numpy(np.ascontiguousarray(records).reshape(-1))


_local = threading.local()


def _scratch(nbytes: int) -> int:
    """Address of this thread's scratch buffer, grown to ``nbytes`` (a call uses it only while it
    runs, so one buffer per thread serves every call; allocating per call cost ~1 us)."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.numel() < nbytes:
        buf = _local.buf = torch.empty(max(nbytes, 1 << 16), dtype=torch.uint8)
    return buf.data_ptr()


def _run_linear(
    kernel: Any,
    scratch_bytes: Any,
    x: torch.Tensor,
    packed: torch.Tensor,
    out_features: int,
    format_args: tuple[int, ...],
    threads: int | None,
    refusal: str,
) -> torch.Tensor:
    """One call of a packed-weight linear entry (``mq_linear`` / ``mq_linear_bf16``): ``x [R, K]``
    float32 in, ``y [R, out_features]`` float32 out, ``format_args`` after the output count, the
    scratch sized by ``scratch_bytes(R, K)``; a non-zero return raises ``ValueError`` with
    ``refusal`` (formatted with ``shape`` and ``out``)."""
    x = x.contiguous()
    rows, k = x.shape
    y = torch.empty(rows, out_features, dtype=torch.float32)
    rc = kernel(
        x.data_ptr(),
        rows,
        k,
        packed.data_ptr(),
        out_features,
        *format_args,
        y.data_ptr(),
        _scratch(scratch_bytes(rows, k)),
        threads or torch.get_num_threads(),
    )
    if rc != 0:
        raise ValueError(refusal.format(shape=list(x.shape), out=out_features))
    return y


def qmatmul(
    lib: ctypes.CDLL, x: torch.Tensor, packed: torch.Tensor, out_features: int, bits: int, threads: int | None = None
) -> torch.Tensor:
    """``x [R, K] (float32) @ W.T`` for ``packed = pack(...)`` of ``W [out_features, K]``."""
    refusal = f"qmatmul cannot take x {{shape}} with {{out}} outputs at {bits} bits"
    return _run_linear(lib.mq_linear, lib.mq_scratch_bytes, x, packed, out_features, (bits,), threads, refusal)


def pack_bf16(weight: torch.Tensor) -> torch.Tensor:
    """The bfloat16 kernel's layout of ``weight`` ``[N, K]`` (rounded to bfloat16): tiles of 16
    channels, each ``K/2`` runs of (16 channels x 2 consecutive k).  Raises ``ValueError`` for
    shapes it cannot take (``N % 16``, ``K % 32``)."""
    n, k = weight.shape
    if n % TILE or k % QK:
        raise ValueError(f"cannot pack [{n}, {k}] for bfloat16: needs N % {TILE} == 0 and K % {QK} == 0")
    w = weight.to(torch.bfloat16).view(torch.int16).reshape(n // TILE, TILE, k // 2, 2)
    return w.transpose(1, 2).contiguous().reshape(-1)


def qmatmul_bf16(
    lib: ctypes.CDLL, x: torch.Tensor, packed: torch.Tensor, out_features: int, threads: int | None = None
) -> torch.Tensor:
    """``bf16(x) [R, K] @ W.T`` in float32 for ``packed = pack_bf16(W)`` (needs :func:`bf16_kernel`).
    A row's result does not depend on the other rows of the call nor on ``threads``."""
    matmul = lib.mq_linear_bf16 if bf16_dot(lib) else lib.mq_linear_bf16_fma
    refusal = "qmatmul_bf16 cannot take x {shape} with {out} outputs"
    return _run_linear(matmul, lib.mq_bf16_scratch_bytes, x, packed, out_features, (), threads, refusal)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes ``[R, K]``, ``da`` and ``sa`` ``[R, K/32]`` exactly as the kernel computes them."""
    xb = x.float().reshape(x.shape[0], -1, QK)
    amax = xb.abs().amax(-1)
    # tensor / tensor is IEEE division, as in C (torch computes scalar / tensor via a reciprocal)
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    q = torch.round(xb * inv[..., None]).clamp(-128, 127)
    da = amax / 127.0
    return q.reshape(x.shape), da, da * q.sum(-1)


def reference(x: torch.Tensor, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """What the kernel computes (in float64): the int dot per block, scaled, plus the zero term."""
    q, da, sa = quantize_activations(x)
    rows, k = q.shape
    n = codes.shape[0]
    qb = q.double().reshape(rows, 1, k // QK, QK)
    cb = codes.double().reshape(1, n, k // QK, QK)
    dot = (qb * cb).sum(-1)  # [R, N, nb] integers
    d16, m16 = (t.to(torch.float16).double() for t in (d, m))
    return (dot * d16[None] * da.double()[:, None] + m16[None] * sa.double()[:, None]).sum(-1)
