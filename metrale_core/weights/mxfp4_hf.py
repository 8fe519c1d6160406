"""Hugging Face MXFP4 experts (gpt-oss's ``*_blocks`` / ``*_scales``) served as GGUF MXFP4 blocks.

Owner: ``metrale_core.weights``; ``metrale_core.decoder.weights`` wraps the expert store in
:class:`HfMxfp4Experts` when a safetensors checkpoint's ``quantization_config`` says ``mxfp4``
(:func:`is_hf_mxfp4`).

The official gpt-oss checkpoints store each stacked expert parameter ``X`` of transformers
(``mlp.experts.gate_up_proj`` ``[E, D, 2I]``, ``down_proj`` ``[E, I, D]``) as two uint8 tensors:
``X_blocks`` ``[E, out, G, 16]`` and ``X_scales`` ``[E, out, G]``, ``out`` the projection's output
features (``2I``: gate and up interleaved row by row; ``D``) and ``G * 32`` its inputs.  Block
``g`` of a row is 32 e2m1 codes, byte ``j`` holding code ``2j`` in its low nibble and ``2j + 1`` in
its high one, times ``2^(scale - 127)`` (transformers' ``convert_moe_packed_tensors``, which then
transposes to ``X``'s layout).  A GGUF MXFP4 block is the same scale byte followed by 16 bytes,
byte ``j`` holding code ``j`` low and ``j + 16`` high (``gguf_dequant``); :func:`to_gguf_blocks`
is that one conversion (llama.cpp's converter makes the same).

:class:`HfMxfp4Experts` serves the names the gpt-oss weight table asks for, ``X[e][s::k].T`` and
``X[e].T`` (``expert_slices``' selectors on ``X``'s layout: rows ``s::k`` of expert ``e``'s
``[out, in]`` matrix), as GGUF MXFP4 tensors: ``quant_type`` ``"MXFP4"``, ``get_raw`` the
converted blocks (so format ``auto`` multiplies them on the MXFP4 block kernel), ``get`` their
values (``exact`` and the dense formats): transformers' dequantized values, bit for bit.

Invariants:
- Only the asked expert's rows are read and converted (uint8 blocks, 17 bytes per 32 weights),
  and only when numpy first reads ``get_raw``'s data (:class:`PendingBlocks`, views of the mapped
  file until then): a lazy expert (``gguf_repack.PendingRepack``) is converted on its first call,
  as a GGUF's is paged in.  No float copy of an expert is made to serve ``get_raw``.
- A served slice's ``RawSource`` is its blocks' file with the slice's own name (and the scales'
  file where it differs): under ``auto`` its repacked records go to the repack cache
  (``layers.repack_cache``) like a GGUF expert's, so a second load reads them back and converts
  no block (a checkpoint without sources, or a changed file, repacks).
- A slice of ``X`` that is not transposed (``X[e]``, ``X``'s own ``[in, out]`` orientation) is a
  ``WeightsError``: the blocks run along the inputs.  Every other name is the wrapped store's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from metrale_core.errors import ShapeMismatch, WeightsError
from metrale_core.weights.expert_slices import expert_selectors, expert_slice
from metrale_core.weights.gguf_dequant import dequantize
from metrale_core.weights.store import RawSource, RawTensor

__all__ = ["HfMxfp4Experts", "PendingBlocks", "is_hf_mxfp4", "to_gguf_blocks"]


def is_hf_mxfp4(store: Any) -> bool:
    """Whether ``store`` is a safetensors checkpoint whose config says ``quant_method: mxfp4``."""
    config: Mapping[str, Any] = getattr(store, "config", None) or {}
    quant = config.get("quantization_config") or {}
    return getattr(store, "format", None) != "gguf" and quant.get("quant_method") == "mxfp4"


def to_gguf_blocks(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """HF MXFP4 ``blocks`` ``[..., G, 16]`` and ``scales`` ``[..., G]`` (uint8) -> GGUF MXFP4
    blocks ``[..., G, 17]`` (module docstring: the scale byte, then the codes re-paired)."""
    codes = np.stack([blocks & np.uint8(0x0F), blocks >> np.uint8(4)], axis=-1).reshape(*blocks.shape[:-1], 32)
    out = np.empty((*blocks.shape[:-1], 17), dtype=np.uint8)
    out[..., 0] = scales
    np.left_shift(codes[..., 16:], 4, out=out[..., 1:])
    out[..., 1:] |= codes[..., :16]
    return out


def _numpy(t: Any) -> np.ndarray:
    return t.numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


class PendingBlocks:
    """One expert's HF ``blocks`` / ``scales`` rows (views), converted by :func:`to_gguf_blocks`
    to ``[rows, G * 17]`` when numpy reads it (``np.asarray``)."""

    def __init__(self, blocks: Any, scales: Any) -> None:
        self.blocks, self.scales = blocks, scales

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = to_gguf_blocks(_numpy(self.blocks), _numpy(self.scales)).reshape(len(self.blocks), -1)
        return out if dtype is None else out.astype(dtype)


def _source(name: str, shape: tuple[int, int], blocks: RawSource | None, scales: RawSource | None) -> RawSource | None:
    """The source of expert slice ``name``: the blocks' file, with the slice's name and shape (and
    the scales' file where it is another), so the repack cache keys it by every byte it reads."""
    if blocks is None or scales is None:
        return None
    if scales[:3] != blocks[:3]:
        name = f"{name}|{scales.path}|{scales.size}|{scales.mtime_ns}"
    return blocks._replace(name=name, shape=shape)


class HfMxfp4Experts:
    """A weight store that also serves HF MXFP4 expert slices as GGUF MXFP4 tensors."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._store, attr)

    def _packed(self, name: object) -> tuple[str, int] | None:
        """``(X, e)`` when ``name`` is a slice of an MXFP4 pair ``X_blocks`` / ``X_scales``."""
        part = expert_slice(name) if isinstance(name, str) else None
        if part is None or f"{part[0]}_blocks" not in self._store or f"{part[0]}_scales" not in self._store:
            return None
        return part

    def __contains__(self, name: object) -> bool:
        return self._packed(name) is not None or name in self._store

    def _rows(self, name: str) -> tuple[str, int, range, tuple[int, int]]:
        """``(X, e, rows, shape)``: the rows of expert ``e``'s ``[out, in]`` matrix ``name`` reads."""
        base, e = self._packed(name) or (name, 0)
        experts, out, groups, size = (int(s) for s in self._store.shape(f"{base}_blocks"))
        if size != 16 or tuple(self._store.shape(f"{base}_scales")) != (experts, out, groups):
            raise ShapeMismatch(f"tensor {base!r}: MXFP4 blocks / scales of shapes that do not pair")
        if not 0 <= e < experts:
            raise ShapeMismatch(f"tensor {name!r}: {base!r} has {experts} experts, no expert {e}")
        start, step, transposed = expert_selectors(name)
        if not transposed:
            raise WeightsError(f"tensor {name!r}: MXFP4 blocks run along the inputs; read it transposed (.T)")
        rows = range(start, out, step)
        return base, e, rows, (len(rows), groups * 32)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._rows(name)[3] if self._packed(name) else tuple(self._store.shape(name))

    def quant_type(self, name: str) -> str:
        return "MXFP4" if self._packed(name) else self._store.quant_type(name)

    def get_raw(self, name: str) -> RawTensor:
        if not self._packed(name):
            return self._store.get_raw(name)
        base, e, rows, shape = self._rows(name)
        pick = slice(rows.start, rows.stop, rows.step)
        blocks, scales = self._store.get_raw(f"{base}_blocks"), self._store.get_raw(f"{base}_scales")
        pending = PendingBlocks(blocks.data[e][pick], scales.data[e][pick])
        return RawTensor(pending, "MXFP4", shape, _source(name, shape, blocks.source, scales.source))  # type: ignore[arg-type]

    def get(self, name: str, *, dtype: torch.dtype = torch.float32, shape: Sequence[int] | None = None) -> torch.Tensor:
        if not self._packed(name):
            return self._store.get(name, dtype=dtype, shape=shape)
        raw = self.get_raw(name)
        if shape is not None and tuple(shape) != raw.shape:
            raise ShapeMismatch(
                f"tensor {name!r} has shape {list(raw.shape)} but the model expects {list(shape)}; "
                "the checkpoint does not match its config"
            )
        return torch.from_numpy(dequantize(np.asarray(raw.data), "MXFP4", raw.shape)).to(dtype)
