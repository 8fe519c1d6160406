"""Weight formats of the decoder's projections: one callable ``Linear`` per (fused) matrix.

Owner: ``metrale_core.layers``; a model plugin's loader builds every projection and the output head
through :func:`build_linear`, ``model.DecoderLM`` only calls them (``y = linear(x)``).

A *weight format* says how the matrices are kept in memory and multiplied (``--weight-format``,
read from ``LoadOptions.weight_format`` when present, else ``$METRALE_WEIGHT_FORMAT``):

``auto`` (default)
    every tensor keeps its checkpoint's precision class: a GGUF block tensor (Q4_0 ... Q6_K,
    IQ4_NL/IQ4_XS; Q2_K/Q3_K repacked) is multiplied on its own blocks
    (:mod:`metrale_core.layers.formats.gguf_linear`, activations quantized per 32 to 15 bits), F16/BF16
    tensors run in bfloat16 (``bf16``'s C kernel where it runs), F32 tensors in the model dtype
    (``exact``'s path).  No dense copy
    of a quantized matrix is kept, and every row's result is independent of the call's row
    count (batch-invariant).
``exact``
    dense tensors in the model dtype, ``F.linear`` -- bit-identical to dequantize-then-matmul
    (the oracle that reproduces HF transformers; parity tests ask for it explicitly).
``bf16``
    dense bfloat16 matrices; activations are rounded to bfloat16 at each matmul, products are
    summed and returned in float32 by the C kernel (``linear_kinds.Bf16Linear``: AVX512-BF16, or
    float32 FMA on AVX512F / AVX2), batch- and thread-invariant.  Where the C kernel does not run
    or cannot take a shape, torch's bfloat16 ``F.linear`` (oneDNN; NOT invariant: a row changes
    with the call's other rows and the thread count) -- the output head then multiplies its
    bfloat16 values in float32.
``int8``
    symmetric int8 per block of 32 weights (Q8_0's scheme, re-quantized from the dequantized
    weights; per output channel for shapes that are not whole blocks).
``int4``
    GGUF Q4_0 / Q4_1 / Q8_0 matrices keep their own codes and per-32 block scales; every other
    matrix (F16/F32 tensors, shapes the kernels cannot take) is ``int8``.

The quantized formats run on one of two kernels:

- :class:`BlockQuantLinear`, the C kernel of :mod:`metrale_core.layers.formats.cpu_qmatmul` (x86 CPUs with
  AVX512-VNNI and a C compiler; AMX-INT8 tiles for 12 rows or more where the CPU has them): the
  weights are exactly the GGUF block values (``d * q + m``, fp16 scales) and the activations are
  quantized per block of 32 to int8, the way llama.cpp multiplies Q4_x/Q8_0 by Q8_1.  It stays
  efficient from 1 to ~32 rows.
- :class:`Int4Linear`, torch's packed int4 CPU kernel, elsewhere: activations in bfloat16, scales
  and zeros rounded to bfloat16 (``(q - 8) * scale + zero``, ``zero = m + 8d``; an 8-bit code is
  split into two 4-bit planes, ``q = 16 * hi + lo``, multiplied in one call).  Its cost grows with
  every row.

A bfloat16 matmul costs about the same per row for 1 or 64 rows.  So the quantized formats also
keep a bfloat16 copy of each matrix (the dequantized weights, rounded once;
``linear_kinds.bf16_linear``: the invariant C kernel where it runs, else oneDNN) and multiply a
call with more rows than the kernel's crossover (``BLOCK_QUANT_BATCH_ROWS`` or
``SMALL_BATCH_ROWS`` row-planes) through it: decode reads the codes, prefill runs on bfloat16.
Memory: the codes plus 2 bytes per weight.

Invariants:
- Every ``Linear`` maps ``[T, in_features]`` activations of the model dtype to ``[T, out_features]``
  of the same dtype; a bias is added in the model dtype after the matmul.
- Fused projections concatenate their parts along the output dimension (``[q; k; v]``).
- In ``int8``/``int4`` a quantized projection's result depends on how many rows the call has
  (codes or bfloat16 copy); in ``auto`` it does not.
- Only ``exact`` leaves outputs unchanged; the other formats are lossy (measured by the tests in
  ``plugins/metrale-qwen3/tests/test_weight_formats.py``) and run on CPU only.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from attrs import frozen

from metrale_core.errors import ConfigError, ShapeMismatch
from metrale_core.layers.formats import gguf_blocks, gguf_linear
from metrale_core.layers.formats.linear_kinds import (
    DenseLinear,
    add_bias,
    bf16_linear,
    int4_from_gguf,
    int4_ready,
    quantize_int8,
)

__all__ = [
    "DEFAULT_WEIGHT_FORMAT",
    "WEIGHT_FORMATS",
    "WEIGHT_FORMAT_ENV",
    "Linear",
    "StackedLinear",
    "build_embedding",
    "build_linear",
    "build_tied_head",
    "embed_tokens",
    "require_weight_format",
    "resolve_weight_format",
]

WEIGHT_FORMATS = ("auto", "exact", "bf16", "int8", "int4")
DEFAULT_WEIGHT_FORMAT = "auto"
WEIGHT_FORMAT_ENV = "METRALE_WEIGHT_FORMAT"


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
    (:class:`~metrale_core.layers.formats.linear_kinds.Bf16Linear`, or torch in float32 where the
    C kernel does not run).  ``lazy``: GGUF blocks kept in format ``auto`` are
    repacked on the projection's first call, not now (``gguf_repack.PendingRepack``: an MoE's
    routed experts); every other format reads its tensors now.
    """
    out_features = sum(s[0] for s in shapes)
    in_features = shapes[0][1]
    if fmt == "auto":
        return _build_auto(store, names, shapes, dtype, device, bias, dense, output_head, lazy)
    if fmt != "exact" and torch.device(device).type != "cpu":
        raise ConfigError(f"weight format {fmt!r} runs on CPU only; use --weight-format exact on {device}")
    int4 = fmt == "int4" and int4_ready(store, names, out_features, in_features)
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
        lin = bf16_linear(dense, bias)
        if output_head and isinstance(lin, DenseLinear):
            # No C kernel (or a shape it cannot take): the head's bfloat16 values are multiplied in
            # float32 by torch (oneDNN's bfloat16 matmul would round the logits to bfloat16 and tie
            # close ones).
            return DenseLinear(dense.to(torch.bfloat16).to(torch.float32).contiguous(), bias)
        return lin
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
        return add_bias(torch.cat([p(x) for p in self.parts], dim=-1), self.bias)


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
    if gguf_blocks.kind_of(quant_type) is not None:  # GGUF blocks (or HF MXFP4 experts served as them)
        return gguf_linear.gguf_linear([store.get_raw(n) for n in names], bias, lazy=lazy)
    parts = [store.get(n, dtype=dtype, shape=s).to(device) for n, s in zip(names, shapes, strict=True)]
    dense = parts[0] if len(parts) == 1 else torch.cat(parts)
    if quant_type in ("F16", "BF16") and dtype == torch.float32:
        # the checkpoint's own class: bfloat16 values, multiplied by the batch-invariant C kernel
        # (bf16_linear; the head multiplies them in float32)
        if output_head:
            return DenseLinear(dense.to(torch.bfloat16).to(torch.float32).contiguous(), bias)
        return bf16_linear(dense, bias)
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
    if dense is not None and gguf_blocks.kind_of(types[0]) is None:
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
    blocks (:class:`~metrale_core.layers.formats.gguf_linear.QuantEmbedding`, rows dequantized on lookup);
    otherwise the dense tensor in ``dtype``.  Look tokens up with :func:`embed_tokens`."""
    if (
        fmt == "auto"
        and torch.device(device).type == "cpu"
        and getattr(store, "format", None) == "gguf"
        and gguf_blocks.kind_of(store.quant_type(name)) is not None
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
