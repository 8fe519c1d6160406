"""The linear layers of the weight formats: dense, bfloat16 (C kernel), int8 and int4 (torch's
packed kernels) and the GGUF block codes on the C kernel of
:mod:`metrale_core.layers.formats.cpu_qmatmul`; and the functions that quantize a matrix into them.

Owner: ``metrale_core.layers``; :func:`~metrale_core.layers.formats.linear.build_linear` picks one
per projection from the weight format (see :mod:`metrale_core.layers.formats.linear` for the
formats and the kernels' crossovers).

Invariants:
- Every layer maps ``[T, in_features]`` activations of the model dtype to ``[T, out_features]`` of
  the same dtype; a bias is added in the model dtype after the matmul.
- A quantized layer keeping a bfloat16 copy (``batch``, a :func:`bf16_linear`) multiplies calls of
  more rows than its kernel's crossover (``BLOCK_QUANT_BATCH_ROWS`` / ``SMALL_BATCH_ROWS``) through
  it, so its result depends on whether the call's row count passes the crossover; the codes are
  the checkpoint's (GGUF) or symmetric int8 per block of 32 with fp16-rounded scales (Q8_0's rule).
- :class:`Bf16Linear` (and so the batch copy where the C kernel runs and takes the shape) is batch-
  and thread-invariant: a row's result never depends on the call's other rows or thread count.
  The :class:`DenseLinear` fallback of :func:`bf16_linear` (oneDNN's bfloat16 matmul) is not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeGuard

import numpy as np
import torch
import torch.nn.functional as F
from attrs import field, frozen

from metrale_core.layers.formats import cpu_qmatmul

__all__ = [
    "BLOCK_QUANT_BATCH_ROWS",
    "GROUP",
    "INT8PACK_K",
    "QUANT_ACT_DTYPE",
    "SMALL_BATCH_ROWS",
    "Bf16Linear",
    "BlockQuantLinear",
    "DenseLinear",
    "Int4Linear",
    "Int8Linear",
    "add_bias",
    "bf16_linear",
    "block_linear",
    "gguf_blocks",
    "int4_from_gguf",
    "int4_ready",
    "quantize_int8",
]

#: Activation dtype fed to the quantized CPU kernels (they want activations and scales alike).
QUANT_ACT_DTYPE = torch.bfloat16
#: Int8Linear's codes are padded along K to a multiple of this (torch's int8pack kernel needs it).
INT8PACK_K = 16
#: Elements per quantization block.
GROUP = 32
#: Calls with at most this many rows (times planes) use torch's packed kernels; larger ones the
#: bfloat16 copy (crossover measured on SmolLM2's shapes, 2 threads: ~8 rows).
SMALL_BATCH_ROWS = 8
#: The C kernel's crossover against the bfloat16 copy (SmolLM2's shapes, 2 threads: 32-48 rows
#: without AMX, ~64 with it).
BLOCK_QUANT_BATCH_ROWS = 32
#: GGML types whose codes the quantized formats keep -> bytes per 32-element block.
_GGUF_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}


def add_bias(y: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return y if bias is None else y + bias


@frozen
class Matrix:
    """A weight matrix ``weight`` ``[out, in]`` and its optional ``bias`` ``[out]``: the fields of
    the linear kinds that keep the matrix itself (:class:`DenseLinear`, the MoE router's
    ``RowwiseLinear``), each with its own ``__call__``."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])


@frozen
class DenseLinear(Matrix):
    """A dense matrix: in the model dtype for ``exact`` (plain ``F.linear``), in bfloat16 for
    ``bf16`` (activations of another dtype are cast to it and the result back)."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == self.weight.dtype:
            return F.linear(x, self.weight, self.bias)
        return add_bias(F.linear(x.to(self.weight.dtype), self.weight).to(x.dtype), self.bias)


def _batched(
    batch: Bf16Linear | DenseLinear | None, row_planes: int, limit: int
) -> TypeGuard[Bf16Linear | DenseLinear]:
    """A call of ``row_planes`` rows (times planes) goes through the bfloat16 copy, if kept."""
    return batch is not None and row_planes > limit


@frozen
class Int8Linear:
    """Per-output-channel symmetric int8: ``W[n] = scales[n] * qweight[n]`` (``torch._weight_int8pack_mm``;
    only for shapes that are not whole blocks of 32 or tiles of 16 channels).

    ``qweight`` has zero columns up to a multiple of :data:`INT8PACK_K` and the input is padded to
    match: torch 2.13's kernel crashes (SIGSEGV) on AVX512-BF16 CPUs for bfloat16 inputs whose K
    is not a multiple of 16 (seen on AMD Zen 4 with K = 24, 40, 100 and 2 or more rows)."""

    qweight: torch.Tensor  # [N, K padded to INT8PACK_K] int8
    scales: torch.Tensor  # [N] in QUANT_ACT_DTYPE
    bias: torch.Tensor | None = None
    #: bfloat16 copy for calls with more than SMALL_BATCH_ROWS rows (None: always int8).
    batch: Bf16Linear | DenseLinear | None = None

    @property
    def out_features(self) -> int:
        return int(self.qweight.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if _batched(self.batch, x.shape[0], SMALL_BATCH_ROWS):
            return add_bias(self.batch(x), self.bias)
        xq = x.to(self.scales.dtype)
        pad = self.qweight.shape[1] - xq.shape[-1]
        y = torch._weight_int8pack_mm(F.pad(xq, (0, pad)) if pad else xq, self.qweight, self.scales)
        return add_bias(y.to(x.dtype), self.bias)


@frozen
class Int4Linear:
    """4-bit codes in torch's packed CPU layout with per-group ``(scale, zero)``:
    ``W[n, k] = (q[n, k] - 8) * scale[k // g, n] + zero[k // g, n]``.

    With ``planes = 2`` the packed matrix is ``[W_hi | W_lo]`` (an 8-bit code split into its high
    and low nibble, ``q = 16 * hi + lo``) and the input is fed twice, ``[x | x]``, so one 4-bit
    matmul computes ``x @ (W_hi + W_lo).T``."""

    packed: torch.Tensor  # [N, planes * K / 2] uint8 from _convert_weight_to_int4pack_for_cpu
    scales_zeros: torch.Tensor  # [planes * K / g, N, 2] in QUANT_ACT_DTYPE
    group_size: int
    bias: torch.Tensor | None = None
    planes: int = 1
    #: bfloat16 copy for calls with more than SMALL_BATCH_ROWS row-planes (None: always codes).
    batch: Bf16Linear | DenseLinear | None = None

    @property
    def out_features(self) -> int:
        return int(self.packed.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if _batched(self.batch, x.shape[0] * self.planes, SMALL_BATCH_ROWS):
            return add_bias(self.batch(x), self.bias)
        xq = x.to(self.scales_zeros.dtype)
        if self.planes > 1:
            xq = torch.cat([xq] * self.planes, dim=-1)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(xq, self.packed, self.group_size, self.scales_zeros)
        return add_bias(y.to(x.dtype), self.bias)


@frozen
class BlockQuantLinear:
    """``W[n, k] = d[n, k // 32] * q[n, k] + m[n, k // 32]`` (4- or 8-bit unsigned codes, fp16
    scales) through the C kernel of :mod:`metrale_core.layers.formats.cpu_qmatmul` (AVX512-VNNI / AMX), which quantizes
    the activations to int8 per block of 32."""

    packed: torch.Tensor  # cpu_qmatmul.pack(...) records
    out_features: int
    bits: int
    kernel: Any = field(repr=False)  # the loaded ctypes library
    bias: torch.Tensor | None = None
    #: bfloat16 copy for calls with more than BLOCK_QUANT_BATCH_ROWS rows (None: always codes).
    batch: Bf16Linear | DenseLinear | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if _batched(self.batch, x.shape[0], BLOCK_QUANT_BATCH_ROWS):
            return add_bias(self.batch(x), self.bias)
        y = cpu_qmatmul.qmatmul(self.kernel, x.float(), self.packed, self.out_features, self.bits)
        return add_bias(y.to(x.dtype), self.bias)


@frozen
class Bf16Linear:
    """A bfloat16 matrix whose products stay float32 (the C kernel's ``qmatmul_bf16``; oneDNN
    rounds them to bfloat16, 0.125 apart near 25, which ties close logits, and its rows change
    with the call's other rows and thread count).  Batch- and thread-invariant; built by
    :func:`bf16_linear`."""

    packed: torch.Tensor  # cpu_qmatmul.pack_bf16(W)
    out_features: int
    kernel: Any = field(repr=False)
    bias: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).float()  # any leading dimensions, as F.linear takes
        y = cpu_qmatmul.qmatmul_bf16(self.kernel, rows, self.packed, self.out_features)
        return add_bias(y.reshape(*x.shape[:-1], self.out_features).to(x.dtype), self.bias)


def _int8_planes(q: np.ndarray, d: np.ndarray, zero: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Signed 8-bit codes ``q`` ``[N, K]`` of ``W = d * q + zero`` (``d``, ``zero`` ``[N, K/32]``) as
    two 4-bit planes: ``q = 16 * hi + lo``; hi plane ``(c - 8) * 16d`` (``c = hi + 8``), lo plane
    ``(c - 8) * d + 8d + zero``."""
    q = q.astype(np.int32)
    codes = np.concatenate([(q >> 4) + 8, q & 0x0F], axis=1)
    zeros = np.concatenate([np.zeros_like(d), 8 * d + zero], axis=1)
    return codes, np.concatenate([16 * d, d], axis=1), zeros


def _pack(
    codes: np.ndarray,
    scale: np.ndarray,
    zero: np.ndarray,
    planes: int,
    bias: torch.Tensor | None,
    dense: torch.Tensor | None = None,
) -> Int4Linear:
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
        torch.from_numpy(np.ascontiguousarray(codes, dtype=np.int32)), 1
    )
    sz = torch.from_numpy(np.stack([scale.T, zero.T], axis=-1)).to(QUANT_ACT_DTYPE).contiguous()
    return Int4Linear(packed, sz, GROUP, bias, planes=planes, batch=_batch_copy(dense))


def bf16_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Bf16Linear | DenseLinear:
    """``weight`` ``[N, K]`` in bfloat16: :class:`Bf16Linear` (float32 products, batch- and
    thread-invariant) where the C kernel runs and ``N % 16 == 0``, ``K % 32 == 0``; else a
    :class:`DenseLinear` on a bfloat16 tensor (oneDNN: neither invariant nor float32 products)."""
    kernel = cpu_qmatmul.bf16_kernel()
    n, k = weight.shape
    if kernel is not None and n % 16 == 0 and k % GROUP == 0:
        return Bf16Linear(cpu_qmatmul.pack_bf16(weight), int(n), kernel, bias)
    return DenseLinear(weight.to(torch.bfloat16).contiguous(), bias)


def _batch_copy(dense: torch.Tensor | None) -> Bf16Linear | DenseLinear | None:
    """The bfloat16 matrix batched calls multiply by (see the module docstring)."""
    return None if dense is None else bf16_linear(dense)


def block_linear(
    codes: np.ndarray,
    d: np.ndarray,
    m: np.ndarray,
    bits: int,
    bias: torch.Tensor | None = None,
    dense: torch.Tensor | None = None,
) -> BlockQuantLinear | Int4Linear:
    """The projection ``W = d * codes + m`` per block of 32 (unsigned ``bits``-bit codes ``[N, K]``,
    ``d``/``m`` ``[N, K/32]``): :class:`BlockQuantLinear` where the C kernel runs and takes the
    scales, else torch's packed int4 kernel (:class:`Int4Linear`); ``dense`` becomes the batch copy."""
    kernel = cpu_qmatmul.kernel()
    if kernel is not None:
        try:
            packed = cpu_qmatmul.pack(codes, d, m, bits)
        except ValueError:
            pass  # e.g. a scale fp16 cannot hold: torch's kernel keeps float32 -> bfloat16 scales
        else:
            return BlockQuantLinear(packed, int(codes.shape[0]), bits, kernel, bias, _batch_copy(dense))
    if bits == 4:
        return _pack(codes, d, m + np.float32(8.0) * d, 1, bias, dense)
    return _pack(
        *_int8_planes(codes.astype(np.int32) - 128, d, m + np.float32(128.0) * d), planes=2, bias=bias, dense=dense
    )


def quantize_int8(
    weight: torch.Tensor, bias: torch.Tensor | None = None, *, batch_copy: bool = False
) -> BlockQuantLinear | Int4Linear | Int8Linear:
    """Symmetric int8 of a float matrix per block of 32 (``d = max|block| / 127`` rounded to fp16,
    as Q8_0); a shape that is not whole blocks and tiles gets one scale per row
    (:class:`Int8Linear`).  With ``batch_copy`` the result also keeps ``weight`` in bfloat16 for
    batched calls."""
    dense = weight if batch_copy else None
    w = weight.float()
    n, k = w.shape
    if n % 16 == 0 and k % GROUP == 0:
        blocks = w.reshape(n, k // GROUP, GROUP)
        d = (blocks.abs().amax(-1) / 127.0).clamp_min(2.0**-24).half().float()
        q = torch.round(blocks / d[..., None]).clamp_(-127, 127).reshape(n, k)
        d_np = d.numpy()
        codes = (q + 128).to(torch.int32).numpy()
        return block_linear(codes, d_np, np.float32(-128.0) * d_np, 8, bias, dense)
    scales = (w.abs().amax(dim=1) / 127.0).clamp_min(torch.finfo(torch.float32).tiny)
    q = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    q = F.pad(q, (0, -k % INT8PACK_K))  # zero columns: see Int8Linear
    return Int8Linear(q.contiguous(), scales.to(QUANT_ACT_DTYPE), bias, _batch_copy(dense))


def gguf_blocks(raw: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """``(codes, d, m, bits)`` of a Q4_0/Q4_1/Q8_0 tensor: ``W = d * codes + m`` per block of 32,
    unsigned codes ``[N, K]`` (Q4_0: ``m = -8d``; Q8_0: ``codes = q + 128``, ``m = -128d``)."""
    n, k = raw.shape
    type_size = _GGUF_BLOCK_BYTES[raw.quant_type]
    blocks = np.ascontiguousarray(raw.data).reshape(-1).view(np.uint8).reshape(n, k // GROUP, type_size)
    d = blocks[..., 0:2].copy().view("<f2")[..., 0].astype(np.float32)
    if raw.quant_type == "Q8_0":
        codes8 = blocks[..., 2:].view(np.int8).reshape(n, k).astype(np.int32) + 128
        return codes8, d, np.float32(-128.0) * d, 8
    if raw.quant_type == "Q4_1":
        m = blocks[..., 2:4].copy().view("<f2")[..., 0].astype(np.float32)
    else:
        m = np.float32(-8.0) * d
    qs = blocks[..., type_size - 16 :]
    codes = np.empty((n, k // GROUP, GROUP), dtype=np.int32)
    codes[..., :16] = qs & 0x0F
    codes[..., 16:] = qs >> 4
    return codes.reshape(n, k), d, m, 4


def int4_from_gguf(
    raws: Sequence[Any], bias: torch.Tensor | None = None, dense: torch.Tensor | None = None
) -> BlockQuantLinear | Int4Linear:
    """The projection holding the codes of GGUF Q4_0/Q4_1/Q8_0 tensors (fused along rows; all parts
    of one GGML type); ``dense`` (the dequantized matrix) becomes the batch copy."""
    parts = [gguf_blocks(r) for r in raws]
    codes, d, m = (np.concatenate([p[i] for p in parts]) for i in range(3))
    return block_linear(codes, d, m, parts[0][3], bias=bias, dense=dense)


def int4_ready(store: Any, names: Sequence[str], out_features: int, in_features: int) -> bool:
    """True when every part is a GGUF tensor of one type in ``_GGUF_BLOCK_BYTES`` the kernel can take."""
    if getattr(store, "format", None) != "gguf" or out_features % 16 or in_features % GROUP:
        return False
    types = {store.quant_type(n) for n in names}
    return len(types) == 1 and types <= set(_GGUF_BLOCK_BYTES)
