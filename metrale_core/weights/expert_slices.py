"""Experts stacked in one tensor, served one expert at a time: ``name[e]`` is expert ``e`` of ``name``.

Owner: ``metrale_core.weights``; the decoder definition wraps a store in :class:`ExpertSlices`
when it reads an MoE layer (``metrale_core.decoder.moe_weights``).  llama.cpp stacks a layer's
experts as 3-D tensors (``blk.N.ffn_gate_exps.weight``, numpy shape ``[n_expert, rows, cols]``);
the decoder builds one projection per expert through the shared linear layer, which reads 2-D
tensors by name.  Here ``blk.N.ffn_gate_exps.weight[3]`` is expert 3's ``[rows, cols]`` matrix, and
``blk.N.ffn_gate_exps.bias[3]`` row 3 of a stacked ``[n_expert, rows]`` bias.

transformers keeps some experts stacked in its own layout (gpt-oss: ``gate_up_proj`` ``[E, D, 2I]``
with gate and up interleaved column by column, ``down_proj`` ``[E, I, D]``).  Two selectors after
``[e]`` serve those: ``[s::k]`` (every k-th element of the last axis from ``s``) and ``.T`` (the
transposed matrix; a no-op on a 1-D slice): ``gate_up_proj[3][0::2].T`` is expert 3's gate
``[I, D]``.

Invariants:
- ``get_raw`` of a slice is a view of the stacked tensor's stored bytes (the memory-mapped file
  of a GGUF): no expert is copied or dequantized to serve it, and its pages are read only when a
  projection is built from it; its ``source`` is the stacked tensor's with the name ``name[e]``
  (so the repack cache keys each expert apart).
- ``get`` dequantizes the one slice asked for (``exact`` and the other dense formats), never the
  whole stack.  Every other name, and every other attribute, is the wrapped store's.
- A slice of an expert that is out of range, or of a tensor that is not 2-D or 3-D, is a
  ``ShapeMismatch`` naming it; the selectors apply to dense (torch) data only -- a quantized
  tensor's blocks are never split or transposed (``WeightsError``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from metrale_core.errors import ShapeMismatch, WeightsError
from metrale_core.weights.gguf_dequant import dequantize
from metrale_core.weights.store import RawTensor

__all__ = ["ExpertSlices", "expert_selectors", "expert_slice"]

_SLICE = re.compile(r"^(?P<name>.+?)\[(?P<e>\d+)\](?:\[(?P<start>\d+)::(?P<step>\d+)\])?(?P<t>\.T)?$")


def expert_slice(name: str) -> tuple[str, int] | None:
    """``"t.weight[3]"`` -> ``("t.weight", 3)`` (selectors after ``[e]`` ignored); None for a plain name."""
    m = _SLICE.match(name)
    return None if m is None else (m["name"], int(m["e"]))


def expert_selectors(name: str) -> tuple[int, int, bool]:
    """``(start, step, transposed)`` of a slice name (``(0, 1, False)``: the expert as stored)."""
    m = _SLICE.match(name)
    assert m is not None
    step = int(m["step"] or 1)
    return int(m["start"] or 0), step, m["t"] is not None


class ExpertSlices:
    """A weight store that also serves ``name[e]``, expert ``e`` of stacked tensor ``name``."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._store, attr)

    def __contains__(self, name: object) -> bool:
        part = expert_slice(name) if isinstance(name, str) else None
        return name in self._store if part is None else part[0] in self._store

    def _part(self, name: str) -> tuple[str, int, tuple[int, ...]]:
        part = expert_slice(name)
        assert part is not None
        base, e = part
        shape = tuple(int(s) for s in self._store.shape(base))
        if len(shape) not in (2, 3) or not 0 <= e < shape[0]:
            raise ShapeMismatch(f"tensor {name!r}: {base!r} of shape {list(shape)} has no expert {e}")
        start, step, transposed = expert_selectors(name)
        out = [*shape[1:-1], len(range(start, shape[-1], step))]
        return base, e, tuple(reversed(out) if transposed else out)

    def shape(self, name: str) -> tuple[int, ...]:
        if expert_slice(name) is None:
            return tuple(self._store.shape(name))
        return self._part(name)[2]

    def quant_type(self, name: str) -> str:
        part = expert_slice(name)
        return self._store.quant_type(name if part is None else part[0])

    def get_raw(self, name: str) -> RawTensor:
        if expert_slice(name) is None:
            return self._store.get_raw(name)
        base, e, shape = self._part(name)
        raw = self._store.get_raw(base)
        data = raw.data[e] if isinstance(raw.data, torch.Tensor) else np.asarray(raw.data)[e]
        start, step, transposed = expert_selectors(name)
        if (step, start, transposed) != (1, 0, False):
            if not isinstance(data, torch.Tensor):
                raise WeightsError(
                    f"tensor {name!r}: a {raw.quant_type} tensor's blocks cannot be strided or transposed"
                )
            data = data[..., start::step]
            data = data.T if transposed and data.dim() == 2 else data
        source = None if raw.source is None else raw.source._replace(name=name, shape=shape)
        return RawTensor(data, raw.quant_type, shape, source)

    def get(self, name: str, *, dtype: torch.dtype = torch.float32, shape: Sequence[int] | None = None) -> torch.Tensor:
        if expert_slice(name) is None:
            return self._store.get(name, dtype=dtype, shape=shape)
        raw = self.get_raw(name)
        if shape is not None and tuple(shape) != tuple(raw.shape):
            raise ShapeMismatch(
                f"tensor {name!r} has shape {list(raw.shape)} but the model expects {list(shape)}; "
                "the checkpoint does not match its config"
            )
        if isinstance(raw.data, torch.Tensor):
            return raw.data.to(dtype).clone(memory_format=torch.contiguous_format)
        try:
            values = dequantize(raw.data, raw.quant_type, raw.shape)
        except NotImplementedError as exc:
            raise WeightsError(f"tensor {name!r} uses GGML type {raw.quant_type}, which cannot be dequantized") from exc
        return torch.from_numpy(values).to(dtype)
