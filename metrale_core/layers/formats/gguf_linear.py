"""GGUF tensors multiplied on their own blocks: :class:`GGUFLinear` and the quantized token table.

Owner: ``metrale_core.layers``; ``linear.build_linear`` (format ``auto``) builds a
:class:`GGUFLinear` for a GGUF tensor of a type in
:data:`~metrale_core.layers.formats.gguf_blocks.GGUF_KINDS`, and :class:`QuantEmbedding` for a
quantized token table.  The block formats are :mod:`metrale_core.layers.formats.gguf_blocks`,
the repacking :mod:`metrale_core.layers.formats.gguf_repack`.

The C kernel (``kernels/cpu/gguf_qmatmul.c``, AVX2 and AVX512-VNNI, the same bits) multiplies by
the block codes with activations quantized per block of 32, to 15 bits (``255 * hi + lo``, two
int8 dot products: twice llama.cpp's integer work, the same weight bytes) or to int8 as
llama.cpp's Q8_0 -- one :class:`ActivationPrecision` per model, which the load chooses by
measuring both (``metrale_core.loading.activation_probe``): int8 flips near-tied greedy choices
on some models, e.g. the embedded SmolLM2's answer to "What is the capital of France?".
(llama.cpp quantizes activations per 256 for K-quants; per 32 is finer.)

Where the C kernel does not run (no AVX2, no compiler, ``METRALE_KERNELS=native``) the same
codes are multiplied by torch (:func:`fallback_matmul`): exact integer dot products per
sub-block in float32 matmuls, then the scales -- the same maths in another order of float sums.

Invariants:
- A row's result depends only on that row (the kernel splits channel tiles between threads and
  fixes each row's order of sums): batch-invariant by construction.
- A projection built ``lazy`` (an MoE's routed experts) keeps views of the mapped file until its
  first call repacks them, so loading reads no expert and only the experts the router picks are
  ever paged in; the records, and so the results, are those of an eager repack.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from typing import Any

import numpy as np
import torch
from attrs import define, field, frozen

from metrale_core.kernels.custom_op import cpu_layer_library
from metrale_core.layers.formats.cpu_qmatmul import PACKAGE  # the C library of metrale_core.layers
from metrale_core.layers.formats.gguf_blocks import QK, TILE, quantize_activations
from metrale_core.layers.formats.gguf_repack import PendingRepack, Repacked, repack

__all__ = [
    "ActivationPrecision",
    "GGUFLinear",
    "QuantEmbedding",
    "activation_precision_scope",
    "dequantize_rows",
    "fallback_matmul",
    "gguf_kernel",
    "gguf_linear",
    "native_matmul",
]


def gguf_kernel() -> ctypes.CDLL | None:
    """The package's C library when the CPU path is chosen for :class:`GGUFLinear`, else None."""
    return cpu_layer_library("GGUFLinear", PACKAGE)


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
