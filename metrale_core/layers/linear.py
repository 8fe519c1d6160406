"""Weight formats of the decoder's projections: one callable ``Linear`` per (fused) matrix.

Owner: ``metrale_core.layers``; a model plugin's loader builds every projection and the output head
through :func:`build_linear`, ``model.DecoderLM`` only calls them (``y = linear(x)``).

A *weight format* says how the matrices are kept in memory and multiplied (``--weight-format``,
read from ``LoadOptions.weight_format`` when present, else ``$METRALE_WEIGHT_FORMAT``):

``auto`` (default)
    every tensor keeps its checkpoint's precision class: a GGUF block tensor (Q4_0 ... Q6_K,
    IQ4_NL/IQ4_XS; Q2_K/Q3_K repacked) is multiplied on its own blocks
    (:mod:`metrale_core.layers.gguf_linear`, activations quantized per 32 to 15 bits), F16/BF16
    tensors run in bfloat16, F32 tensors in the model dtype (``exact``'s path).  No dense copy
    of a quantized matrix is kept, and every row's result is independent of the call's row
    count (batch-invariant).
``exact``
    dense tensors in the model dtype, ``F.linear`` -- bit-identical to dequantize-then-matmul
    (the oracle that reproduces HF transformers; parity tests ask for it explicitly).
``bf16``
    dense bfloat16 matrices; activations are cast to bfloat16 at each matmul and the result back
    (the output head keeps its products in float32 where the CPU has AVX512-BF16).
``int8``
    symmetric int8 per block of 32 weights (Q8_0's scheme, re-quantized from the dequantized
    weights; per output channel for shapes that are not whole blocks).
``int4``
    GGUF Q4_0 / Q4_1 / Q8_0 matrices keep their own codes and per-32 block scales; every other
    matrix (F16/F32 tensors, shapes the kernels cannot take) is ``int8``.

The quantized formats run on one of two kernels:

- :class:`BlockQuantLinear`, the C kernel of :mod:`metrale_core.layers.cpu_qmatmul` (x86 CPUs with
  AVX512-VNNI and a C compiler; AMX-INT8 tiles for 12 rows or more where the CPU has them): the
  weights are exactly the GGUF block values (``d * q + m``, fp16 scales) and the activations are
  quantized per block of 32 to int8, the way llama.cpp multiplies Q4_x/Q8_0 by Q8_1.  It stays
  efficient from 1 to ~32 rows.
- :class:`Int4Linear`, torch's packed int4 CPU kernel, elsewhere: activations in bfloat16, scales
  and zeros rounded to bfloat16 (``(q - 8) * scale + zero``, ``zero = m + 8d``; an 8-bit code is
  split into two 4-bit planes, ``q = 16 * hi + lo``, multiplied in one call).  Its cost grows with
  every row.

oneDNN's bfloat16 matmul (AMX / AVX512-BF16) costs about the same for 1 or 64 rows.  So the
quantized formats also keep a bfloat16 copy of each matrix (the dequantized weights, rounded
once) and multiply a call with more rows than the kernel's crossover (``BLOCK_QUANT_BATCH_ROWS``
or ``SMALL_BATCH_ROWS`` row-planes) through it: decode reads the codes, prefill runs on
bfloat16.  Memory: the codes plus 2 bytes per weight.

Invariants:
- Every ``Linear`` maps ``[T, in_features]`` activations of the model dtype to ``[T, out_features]``
  of the same dtype; a bias is added in the model dtype after the matmul.
- Fused projections concatenate their parts along the output dimension (``[q; k; v]``).
- In ``int8``/``int4`` a quantized projection's result depends on how many rows the call has
  (codes or bfloat16 copy); in ``auto`` it does not.
- Only ``exact`` leaves outputs unchanged; the other formats are lossy (measured by the tests in
  ``tests/test_weight_formats.py``) and run on CPU only.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Protocol, TypeGuard

import numpy as np
import torch
import torch.nn.functional as F
from attrs import field, frozen

from metrale_core.errors import ConfigError, ShapeMismatch
from metrale_core.layers import cpu_qmatmul, gguf_linear

__all__ = [
    "DEFAULT_WEIGHT_FORMAT",
    "WEIGHT_FORMATS",
    "WEIGHT_FORMAT_ENV",
    "Bf16Linear",
    "BlockQuantLinear",
    "DenseLinear",
    "Int4Linear",
    "Int8Linear",
    "Linear",
    "StackedLinear",
    "block_linear",
    "build_embedding",
    "build_linear",
    "build_tied_head",
    "embed_tokens",
    "gguf_blocks",
    "int4_from_gguf",
    "quantize_int8",
    "require_weight_format",
    "resolve_weight_format",
]

WEIGHT_FORMATS = ("auto", "exact", "bf16", "int8", "int4")
DEFAULT_WEIGHT_FORMAT = "auto"
WEIGHT_FORMAT_ENV = "METRALE_WEIGHT_FORMAT"
#: Activation dtype fed to the quantized CPU kernels (they want activations and scales alike).
QUANT_ACT_DTYPE = torch.bfloat16
#: Int8Linear's codes are padded along K to a multiple of this (torch's int8pack kernel needs it).
INT8PACK_K = 16
_GROUP = 32
#: Calls with at most this many rows (times planes) use torch's packed kernels; larger ones the
#: bfloat16 copy (crossover measured on SmolLM2's shapes, 2 threads: ~8 rows).
SMALL_BATCH_ROWS = 8
#: The C kernel's crossover against the bfloat16 copy (SmolLM2's shapes, 2 threads: 32-48 rows
#: without AMX, ~64 with it).
BLOCK_QUANT_BATCH_ROWS = 32
#: GGML types whose codes the quantized formats keep -> bytes per 32-element block.
_GGUF_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}


class Linear(Protocol):
    """``y = x @ W.T (+ b)`` for one (fused) projection in some storage format."""

    @property
    def out_features(self) -> int: ...

    @property
    def bias(self) -> torch.Tensor | None:
        """Added after the matmul (None: no bias); a fused projection's is the concatenation."""
        ...

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


def resolve_weight_format(options: Any = None) -> str:
    """The weight format to load with: ``options.weight_format``, else the environment, else auto."""
    fmt = getattr(options, "weight_format", None) or os.environ.get(WEIGHT_FORMAT_ENV) or DEFAULT_WEIGHT_FORMAT
    fmt = str(fmt).lower()
    if fmt not in WEIGHT_FORMATS:
        raise ConfigError(
            f"weight format {fmt!r} is not supported; use one of {', '.join(WEIGHT_FORMATS)} "
            f"(set by --weight-format or ${WEIGHT_FORMAT_ENV})"
        )
    return fmt


def require_weight_format(options: Any, supported: Sequence[str], model: str) -> str:
    """The requested weight format (:func:`resolve_weight_format`) when ``model``'s loader can
    honour it; a ``ConfigError`` naming what it supports otherwise -- a loader never ignores a
    requested format silently.  ``auto`` (the default) becomes ``exact`` for a loader without it."""
    fmt = resolve_weight_format(options)
    if fmt == "auto" and "auto" not in supported:
        return "exact"  # the checkpoint's own precision, as far as this loader keeps formats
    if fmt not in supported:
        raise ConfigError(
            f"the {model} loader cannot keep weights in format {fmt!r} (it supports "
            f"{', '.join(supported)}); drop --weight-format / ${WEIGHT_FORMAT_ENV} or use "
            f"one of those"
        )
    return fmt


def _add_bias(y: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return y if bias is None else y + bias


@frozen
class DenseLinear:
    """A dense matrix: in the model dtype for ``exact`` (plain ``F.linear``), in bfloat16 for
    ``bf16`` (activations of another dtype are cast to it and the result back)."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == self.weight.dtype:
            return F.linear(x, self.weight, self.bias)
        return _add_bias(F.linear(x.to(self.weight.dtype), self.weight).to(x.dtype), self.bias)


def _batched(dense: torch.Tensor | None, row_planes: int, limit: int) -> TypeGuard[torch.Tensor]:
    """A call of ``row_planes`` rows (times planes) goes through the bfloat16 copy, if kept."""
    return dense is not None and row_planes > limit


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
    #: [N, K] bfloat16 copy for calls with more than SMALL_BATCH_ROWS rows (None: always int8).
    dense: torch.Tensor | None = None

    @property
    def out_features(self) -> int:
        return int(self.qweight.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        xq = x.to(self.scales.dtype)
        if _batched(self.dense, x.shape[0], SMALL_BATCH_ROWS):
            y = F.linear(xq, self.dense)
        else:
            pad = self.qweight.shape[1] - xq.shape[-1]
            y = torch._weight_int8pack_mm(F.pad(xq, (0, pad)) if pad else xq, self.qweight, self.scales)
        return _add_bias(y.to(x.dtype), self.bias)


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
    #: [N, K] bfloat16 copy for calls with more than SMALL_BATCH_ROWS row-planes (None: always codes).
    dense: torch.Tensor | None = None

    @property
    def out_features(self) -> int:
        return int(self.packed.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        xq = x.to(self.scales_zeros.dtype)
        if _batched(self.dense, x.shape[0] * self.planes, SMALL_BATCH_ROWS):
            return _add_bias(F.linear(xq, self.dense).to(x.dtype), self.bias)
        if self.planes > 1:
            xq = torch.cat([xq] * self.planes, dim=-1)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(xq, self.packed, self.group_size, self.scales_zeros)
        return _add_bias(y.to(x.dtype), self.bias)


@frozen
class BlockQuantLinear:
    """``W[n, k] = d[n, k // 32] * q[n, k] + m[n, k // 32]`` (4- or 8-bit unsigned codes, fp16
    scales) through the C kernel of :mod:`metrale_core.layers.cpu_qmatmul` (AVX512-VNNI / AMX), which quantizes
    the activations to int8 per block of 32."""

    packed: torch.Tensor  # cpu_qmatmul.pack(...) records
    out_features: int
    bits: int
    kernel: Any = field(repr=False)  # the loaded ctypes library
    bias: torch.Tensor | None = None
    #: [N, K] bfloat16 copy for calls with more than BLOCK_QUANT_BATCH_ROWS rows (None: always codes).
    dense: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if _batched(self.dense, x.shape[0], BLOCK_QUANT_BATCH_ROWS):
            return _add_bias(F.linear(x.to(QUANT_ACT_DTYPE), self.dense).to(x.dtype), self.bias)
        y = cpu_qmatmul.qmatmul(self.kernel, x.float(), self.packed, self.out_features, self.bits)
        return _add_bias(y.to(x.dtype), self.bias)


@frozen
class Bf16Linear:
    """A bfloat16 matrix whose products stay float32 (the C kernel's ``qmatmul_bf16``; oneDNN
    rounds them to bfloat16, 0.125 apart near 25, which ties close logits).  The ``bf16`` format's
    output head."""

    packed: torch.Tensor  # cpu_qmatmul.pack_bf16(W)
    out_features: int
    kernel: Any = field(repr=False)
    bias: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = cpu_qmatmul.qmatmul_bf16(self.kernel, x.float(), self.packed, self.out_features)
        return _add_bias(y.to(x.dtype), self.bias)


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
    return Int4Linear(packed, sz, _GROUP, bias, planes=planes, dense=_batch_copy(dense))


def _batch_copy(dense: torch.Tensor | None) -> torch.Tensor | None:
    """The bfloat16 matrix batched calls multiply by (see the module docstring)."""
    return None if dense is None else dense.to(QUANT_ACT_DTYPE).contiguous()


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
    if n % 16 == 0 and k % _GROUP == 0:
        blocks = w.reshape(n, k // _GROUP, _GROUP)
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
    blocks = np.ascontiguousarray(raw.data).reshape(-1).view(np.uint8).reshape(n, k // _GROUP, type_size)
    d = blocks[..., 0:2].copy().view("<f2")[..., 0].astype(np.float32)
    if raw.quant_type == "Q8_0":
        codes8 = blocks[..., 2:].view(np.int8).reshape(n, k).astype(np.int32) + 128
        return codes8, d, np.float32(-128.0) * d, 8
    if raw.quant_type == "Q4_1":
        m = blocks[..., 2:4].copy().view("<f2")[..., 0].astype(np.float32)
    else:
        m = np.float32(-8.0) * d
    qs = blocks[..., type_size - 16 :]
    codes = np.empty((n, k // _GROUP, _GROUP), dtype=np.int32)
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


def _int4_ready(store: Any, names: Sequence[str], out_features: int, in_features: int) -> bool:
    """True when every part is a GGUF tensor of one type in ``_GGUF_BLOCK_BYTES`` the kernel can take."""
    if getattr(store, "format", None) != "gguf" or out_features % 16 or in_features % _GROUP:
        return False
    types = {store.quant_type(n) for n in names}
    return len(types) == 1 and types <= set(_GGUF_BLOCK_BYTES)


def build_linear(
    store: Any,
    names: Sequence[str],
    shapes: Sequence[tuple[int, int]],
    fmt: str,
    dtype: torch.dtype,
    device: torch.device | str,
    bias: torch.Tensor | None = None,
    dense: torch.Tensor | None = None,
    *,
    output_head: bool = False,
    lazy: bool = False,
) -> Linear:
    """The projection stacking tensors ``names`` (with their expected ``shapes``) in format ``fmt``.

    ``dense`` is the already-loaded fused matrix in ``dtype`` when the caller has it (the tied
    output head reuses the embedding); otherwise the parts are read with ``store.get``.
    ``output_head``: the matrix computes the logits, which ``bf16`` keeps in float32
    (:class:`Bf16Linear`) where the CPU can.  ``lazy``: GGUF blocks kept in format ``auto`` are
    repacked on the projection's first call, not now (``gguf_linear.PendingRepack``: an MoE's
    routed experts); every other format reads its tensors now.
    """
    out_features = sum(s[0] for s in shapes)
    in_features = shapes[0][1]
    if fmt == "auto":
        return _build_auto(store, names, shapes, dtype, device, bias, dense, output_head, lazy)
    if fmt != "exact" and torch.device(device).type != "cpu":
        raise ConfigError(f"weight format {fmt!r} runs on CPU only; use --weight-format exact on {device}")
    int4 = fmt == "int4" and _int4_ready(store, names, out_features, in_features)
    if int4:
        for name, shape in zip(names, shapes):
            if tuple(store.shape(name)) != tuple(shape):
                raise ShapeMismatch(
                    f"tensor {name!r} has shape {list(store.shape(name))} but the model "
                    f"expects {list(shape)}; the checkpoint does not match its config"
                )
    if dense is None:
        parts = [store.get(n, dtype=dtype, shape=s).to(device) for n, s in zip(names, shapes)]
        dense = parts[0] if len(parts) == 1 else torch.cat(parts)
    if fmt == "exact":
        return DenseLinear(dense, bias)
    if fmt == "bf16":
        kernel = cpu_qmatmul.bf16_kernel() if output_head else None
        if kernel is not None and out_features % 16 == 0 and in_features % _GROUP == 0:
            return Bf16Linear(cpu_qmatmul.pack_bf16(dense), out_features, kernel, bias)
        if output_head:
            # No AVX512-BF16 kernel: the head's bfloat16 values are multiplied in float32 by torch
            # (oneDNN's bfloat16 matmul would round the logits to bfloat16 and tie close ones).
            return DenseLinear(dense.to(torch.bfloat16).to(torch.float32).contiguous(), bias)
        return DenseLinear(dense.to(torch.bfloat16).contiguous(), bias)
    if int4:
        return int4_from_gguf([store.get_raw(n) for n in names], bias, dense)
    return quantize_int8(dense, bias, batch_copy=True)


@frozen
class StackedLinear:
    """Parts of a fused projection kept in different formats (a Q4_K_M file's ``attn_v`` is Q6_K
    while ``attn_q``/``attn_k`` are Q4_K): ``y = [part_0(x) | part_1(x) | ...] (+ bias)``."""

    parts: tuple[Any, ...]
    bias: torch.Tensor | None = None

    @property
    def out_features(self) -> int:
        return sum(p.out_features for p in self.parts)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _add_bias(torch.cat([p(x) for p in self.parts], dim=-1), self.bias)


def _check_shapes(store: Any, names: Sequence[str], shapes: Sequence[tuple[int, int]]) -> None:
    for name, shape in zip(names, shapes, strict=True):
        if tuple(store.shape(name)) != tuple(shape):
            raise ShapeMismatch(
                f"tensor {name!r} has shape {list(store.shape(name))} but the model "
                f"expects {list(shape)}; the checkpoint does not match its config"
            )


def _auto_part(
    store: Any,
    names: Sequence[str],
    shapes: Sequence[tuple[int, int]],
    quant_type: str,
    dtype: torch.dtype,
    device: torch.device | str,
    bias: torch.Tensor | None,
    output_head: bool,
    lazy: bool = False,
) -> Linear:
    """One run of same-typed parts of a projection in format ``auto``."""
    if gguf_linear.kind_of(quant_type) is not None:  # GGUF blocks (or HF MXFP4 experts served as them)
        return gguf_linear.gguf_linear([store.get_raw(n) for n in names], bias, lazy=lazy)
    parts = [store.get(n, dtype=dtype, shape=s).to(device) for n, s in zip(names, shapes, strict=True)]
    dense = parts[0] if len(parts) == 1 else torch.cat(parts)
    if quant_type in ("F16", "BF16") and dtype == torch.float32:
        # the checkpoint's own class: bfloat16 values (the head multiplies them in float32)
        dense = dense.to(torch.bfloat16)
        return DenseLinear(dense.to(torch.float32).contiguous() if output_head else dense.contiguous(), bias)
    return DenseLinear(dense.to(dtype).contiguous(), bias)


def _build_auto(
    store: Any,
    names: Sequence[str],
    shapes: Sequence[tuple[int, int]],
    dtype: torch.dtype,
    device: torch.device | str,
    bias: torch.Tensor | None,
    dense: torch.Tensor | None,
    output_head: bool,
    lazy: bool = False,
) -> Linear:
    """Format ``auto`` (module docstring): each part in its checkpoint's precision class."""
    on_cpu = torch.device(device).type == "cpu"
    if not on_cpu or getattr(store, "format", None) not in ("gguf", "safetensors"):
        if dense is None:
            parts = [store.get(n, dtype=dtype, shape=s).to(device) for n, s in zip(names, shapes, strict=True)]
            dense = parts[0] if len(parts) == 1 else torch.cat(parts)
        return DenseLinear(dense, bias)
    _check_shapes(store, names, shapes)
    types = [store.quant_type(n) for n in names]
    if dense is not None and gguf_linear.kind_of(types[0]) is None:
        return DenseLinear(dense, bias)
    runs: list[tuple[str, list[int]]] = []
    for i, t in enumerate(types):
        if runs and runs[-1][0] == t:
            runs[-1][1].append(i)
        else:
            runs.append((t, [i]))
    if len(runs) == 1:
        return _auto_part(store, names, shapes, types[0], dtype, device, bias, output_head, lazy)
    stacked = tuple(
        _auto_part(store, [names[i] for i in idx], [shapes[i] for i in idx], t, dtype, device, None, output_head, lazy)
        for t, idx in runs
    )
    return StackedLinear(stacked, bias)


def build_embedding(
    store: Any, name: str, shape: tuple[int, int], fmt: str, dtype: torch.dtype, device: torch.device | str
) -> torch.Tensor | gguf_linear.QuantEmbedding:
    """The token table ``name``: in format ``auto`` a quantized GGUF table on CPU stays in its
    blocks (:class:`~metrale_core.layers.gguf_linear.QuantEmbedding`, rows dequantized on lookup);
    otherwise the dense tensor in ``dtype``.  Look tokens up with :func:`embed_tokens`."""
    if (
        fmt == "auto"
        and torch.device(device).type == "cpu"
        and getattr(store, "format", None) == "gguf"
        and gguf_linear.kind_of(store.quant_type(name)) is not None
    ):
        _check_shapes(store, [name], [shape])
        return gguf_linear.QuantEmbedding(store.get_raw(name), dtype)
    return store.get(name, dtype=dtype, shape=shape).to(device)


def build_tied_head(
    store: Any,
    name: str,
    table: torch.Tensor | gguf_linear.QuantEmbedding,
    shape: tuple[int, int],
    fmt: str,
    dtype: torch.dtype,
    device: torch.device | str,
) -> Linear:
    """The output head tied to the token table ``table`` (:func:`build_embedding` of ``name``): the
    dense table itself when it is a tensor; a table kept in its GGUF blocks gives a head that
    multiplies those blocks (never a dense copy)."""
    dense = table if isinstance(table, torch.Tensor) else None
    return build_linear(store, [name], [shape], fmt, dtype, device, dense=dense, output_head=True)


def embed_tokens(ids: torch.Tensor, table: torch.Tensor | gguf_linear.QuantEmbedding) -> torch.Tensor:
    """Rows ``ids`` of a token table from :func:`build_embedding` (``F.embedding`` for a tensor)."""
    if isinstance(table, gguf_linear.QuantEmbedding):
        return table.lookup(ids)
    return F.embedding(ids, table)
