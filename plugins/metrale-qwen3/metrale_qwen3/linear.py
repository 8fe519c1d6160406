"""Weight formats of the decoder's projections: one callable ``Linear`` per (fused) matrix.

Owner: ``metrale_qwen3``; ``loader.load_weights`` builds every projection and the output head
through :func:`build_linear`, ``model.DecoderLM`` only calls them (``y = linear(x)``).

A *weight format* says how the matrices are kept in memory and multiplied (``--weight-format``,
read from ``LoadOptions.weight_format`` when present, else ``$METRALE_WEIGHT_FORMAT``):

``exact`` (default)
    dense tensors in the model dtype, ``F.linear`` -- bit-identical to dequantize-then-matmul.
``bf16``
    dense bfloat16 matrices; activations are cast to bfloat16 at each matmul and the result back.
``int8``
    symmetric per-output-channel int8 (re-quantized from the dequantized weights), multiplied as
    two 4-bit planes through the int4 kernel below (``torch._weight_int8pack_mm`` for shapes it
    cannot pack); batches go through a bfloat16 copy (see below).
``int4``
    GGUF Q4_0 / Q4_1 / Q8_0 matrices keep their own codes and per-32 group scales through torch's
    int4 packed CPU kernel (``(q - 8) * scale + zero`` with ``scale = d``, ``zero = m + 8d``; a Q8_0
    code is split into two 4-bit planes, ``q = 16 * hi + lo``, multiplied in one call), so the
    weights are the GGUF's values up to the rounding of ``scale``/``zero`` to bfloat16 and the
    activations enter the matmul in bfloat16; every other matrix (F16/F32 tensors, shapes the
    kernel cannot pack) is ``int8``.

The packed 4-bit kernel streams few bytes but its cost grows with the number of rows, while
oneDNN's bfloat16 matmul (AMX / AVX512-BF16) costs about the same for 1 or 64 rows.  So the
quantized formats also keep a bfloat16 copy of each matrix (the dequantized weights, rounded
once) and multiply a call with more than ``SMALL_BATCH_ROWS`` row-planes through it: decode of a
few sequences reads 4-bit codes, batched decode and prefill run on bfloat16.  Memory: the codes
plus 2 bytes per weight.

Invariants:
- Every ``Linear`` maps ``[T, in_features]`` activations of the model dtype to ``[T, out_features]``
  of the same dtype; a bias is added in the model dtype after the matmul.
- Fused projections concatenate their parts along the output dimension (``[q; k; v]``).
- A quantized projection's result depends on how many rows the call has (codes or bfloat16
  copy); both stay within the format's measured error of ``exact``.
- Only ``exact`` leaves outputs unchanged; the other formats are lossy (measured by the tests in
  ``tests/test_weight_formats.py``) and run on CPU only.
"""

from __future__ import annotations

import os
from typing import Any, Protocol, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from attrs import frozen

from metrale_core.errors import ConfigError, ShapeMismatch

__all__ = ["WEIGHT_FORMATS", "WEIGHT_FORMAT_ENV", "DenseLinear", "Int4Linear",
           "Int8Linear", "Linear", "build_linear", "int4_from_gguf", "quantize_int8",
           "resolve_weight_format"]

WEIGHT_FORMATS = ("exact", "bf16", "int8", "int4")
WEIGHT_FORMAT_ENV = "METRALE_WEIGHT_FORMAT"
#: Activation dtype fed to the quantized CPU kernels (they want activations and scales alike).
QUANT_ACT_DTYPE = torch.bfloat16
_GROUP = 32
#: Calls with at most this many rows (times planes) use the packed kernels; larger ones the
#: bfloat16 copy (crossover measured on SmolLM2's shapes, 2 threads: ~8 rows).
SMALL_BATCH_ROWS = 8
#: GGML type -> (bytes per 32-element block, 4-bit planes); Q8_0 is split into two nibble planes.
_INT4_TYPES = {"Q4_0": (18, 1), "Q4_1": (20, 1), "Q8_0": (34, 2)}


class Linear(Protocol):
    """``y = x @ W.T (+ b)`` for one (fused) projection in some storage format."""

    out_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


def resolve_weight_format(options: Any = None) -> str:
    """The weight format to load with: ``options.weight_format``, else the environment, else exact."""
    fmt = getattr(options, "weight_format", None) or os.environ.get(WEIGHT_FORMAT_ENV) or "exact"
    fmt = str(fmt).lower()
    if fmt not in WEIGHT_FORMATS:
        raise ConfigError(f"weight format {fmt!r} is not supported; use one of {', '.join(WEIGHT_FORMATS)} "
                          f"(set by --weight-format or ${WEIGHT_FORMAT_ENV})")
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


def _batched(dense: torch.Tensor | None, row_planes: int) -> bool:
    """A call of ``row_planes`` rows (times planes) goes through the bfloat16 copy, if kept."""
    return dense is not None and row_planes > SMALL_BATCH_ROWS


@frozen
class Int8Linear:
    """Per-output-channel symmetric int8: ``W[n] = scales[n] * qweight[n]``."""

    qweight: torch.Tensor  # [N, K] int8
    scales: torch.Tensor  # [N] in QUANT_ACT_DTYPE
    bias: torch.Tensor | None = None
    #: [N, K] bfloat16 copy for calls with more than SMALL_BATCH_ROWS rows (None: always int8).
    dense: torch.Tensor | None = None

    @property
    def out_features(self) -> int:
        return int(self.qweight.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        xq = x.to(self.scales.dtype)
        if _batched(self.dense, x.shape[0]):
            y = F.linear(xq, self.dense)
        else:
            y = torch._weight_int8pack_mm(xq, self.qweight, self.scales)
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
        if _batched(self.dense, x.shape[0] * self.planes):
            return _add_bias(F.linear(xq, self.dense).to(x.dtype), self.bias)
        if self.planes > 1:
            xq = torch.cat([xq] * self.planes, dim=-1)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(xq, self.packed, self.group_size, self.scales_zeros)
        return _add_bias(y.to(x.dtype), self.bias)


def _int8_planes(q: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """8-bit codes ``q`` ``[N, K]`` with group scales ``d`` ``[N, K/32]`` as two 4-bit planes:
    ``q = 16 * hi + lo``; hi plane ``(c - 8) * 16d`` (``c = hi + 8``), lo plane ``(c - 8) * d + 8d``."""
    q = q.astype(np.int32)
    codes = np.concatenate([(q >> 4) + 8, q & 0x0F], axis=1)
    return codes, np.concatenate([16 * d, d], axis=1), np.concatenate([np.zeros_like(d), 8 * d], axis=1)


def _pack(codes: np.ndarray, scale: np.ndarray, zero: np.ndarray, planes: int,
          bias: torch.Tensor | None, dense: torch.Tensor | None = None) -> Int4Linear:
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
        torch.from_numpy(np.ascontiguousarray(codes, dtype=np.int32)), 1)
    sz = torch.from_numpy(np.stack([scale.T, zero.T], axis=-1)).to(QUANT_ACT_DTYPE).contiguous()
    return Int4Linear(packed, sz, _GROUP, bias, planes=planes, dense=_batch_copy(dense))


def _batch_copy(dense: torch.Tensor | None) -> torch.Tensor | None:
    """The bfloat16 matrix batched calls multiply by (see the module docstring)."""
    return None if dense is None else dense.to(QUANT_ACT_DTYPE).contiguous()


def quantize_int8(weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                  batch_copy: bool = False) -> Int8Linear | Int4Linear:
    """Symmetric per-row int8 of a float matrix (scale = max|row| / 127); run as two 4-bit planes
    (:class:`Int4Linear`, the faster CPU kernel) when the shape allows, else :class:`Int8Linear`.
    With ``batch_copy`` the result also keeps ``weight`` in bfloat16 for batched calls."""
    dense = weight if batch_copy else None
    w = weight.float()
    scales = (w.abs().amax(dim=1) / 127.0).clamp_min(torch.finfo(torch.float32).tiny)
    q = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    n, k = q.shape
    if n % 16 == 0 and k % _GROUP == 0:
        d = np.repeat(scales.numpy()[:, None], k // _GROUP, axis=1)
        return _pack(*_int8_planes(q.numpy(), d), planes=2, bias=bias, dense=dense)
    return Int8Linear(q.contiguous(), scales.to(QUANT_ACT_DTYPE), bias, _batch_copy(dense))


def _gguf_int4_parts(raw: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes ``[N, P*K]`` (0..15), scale and zero ``[N, P*K/32]`` (float32) of a Q4_0/Q4_1/Q8_0
    tensor; ``P`` is 2 for Q8_0 (high-nibble plane, then low-nibble plane), else 1."""
    n, k = raw.shape
    type_size, _ = _INT4_TYPES[raw.quant_type]
    blocks = np.ascontiguousarray(raw.data).reshape(-1).view(np.uint8).reshape(n, k // _GROUP, type_size)
    d = blocks[..., 0:2].copy().view("<f2")[..., 0].astype(np.float32)
    if raw.quant_type == "Q8_0":
        return _int8_planes(blocks[..., 2:].view(np.int8).reshape(n, k), d)
    if raw.quant_type == "Q4_1":
        zero = blocks[..., 2:4].copy().view("<f2")[..., 0].astype(np.float32) + np.float32(8.0) * d
    else:
        zero = np.zeros_like(d)
    qs = blocks[..., type_size - 16:]
    codes = np.empty((n, k // _GROUP, _GROUP), dtype=np.int32)
    codes[..., :16] = qs & 0x0F
    codes[..., 16:] = qs >> 4
    return codes.reshape(n, k), d, zero


def int4_from_gguf(raws: Sequence[Any], bias: torch.Tensor | None = None,
                   dense: torch.Tensor | None = None) -> Int4Linear:
    """An :class:`Int4Linear` holding the codes of GGUF Q4_0/Q4_1/Q8_0 tensors (fused along rows;
    all parts of one GGML type); ``dense`` (the dequantized matrix) becomes the batch copy."""
    parts = [_gguf_int4_parts(r) for r in raws]
    return _pack(*(np.concatenate([p[i] for p in parts]) for i in range(3)),
                 planes=_INT4_TYPES[raws[0].quant_type][1], bias=bias, dense=dense)


def _int4_ready(store: Any, names: Sequence[str], out_features: int, in_features: int) -> bool:
    """True when every part is a GGUF tensor of one type in ``_INT4_TYPES`` the kernel can take."""
    if getattr(store, "format", None) != "gguf" or out_features % 16 or in_features % _GROUP:
        return False
    types = {store.quant_type(n) for n in names}
    return len(types) == 1 and types <= set(_INT4_TYPES)


def build_linear(store: Any, names: Sequence[str], shapes: Sequence[tuple[int, int]], fmt: str,
                 dtype: torch.dtype, device: torch.device | str,
                 bias: torch.Tensor | None = None,
                 dense: torch.Tensor | None = None) -> Linear:
    """The projection stacking tensors ``names`` (with their expected ``shapes``) in format ``fmt``.

    ``dense`` is the already-loaded fused matrix in ``dtype`` when the caller has it (the tied
    output head reuses the embedding); otherwise the parts are read with ``store.get``.
    """
    out_features = sum(s[0] for s in shapes)
    in_features = shapes[0][1]
    if fmt != "exact" and torch.device(device).type != "cpu":
        raise ConfigError(f"weight format {fmt!r} runs on CPU only; use --weight-format exact on {device}")
    int4 = fmt == "int4" and _int4_ready(store, names, out_features, in_features)
    if int4:
        for name, shape in zip(names, shapes):
            if tuple(store.shape(name)) != tuple(shape):
                raise ShapeMismatch(f"tensor {name!r} has shape {list(store.shape(name))} but the model "
                                    f"expects {list(shape)}; the checkpoint does not match its config")
    if dense is None:
        parts = [store.get(n, dtype=dtype, shape=s).to(device) for n, s in zip(names, shapes)]
        dense = parts[0] if len(parts) == 1 else torch.cat(parts)
    if fmt == "exact":
        return DenseLinear(dense, bias)
    if fmt == "bf16":
        return DenseLinear(dense.to(torch.bfloat16).contiguous(), bias)
    if int4:
        return int4_from_gguf([store.get_raw(n) for n in names], bias, dense)
    return quantize_int8(dense, bias, batch_copy=True)
