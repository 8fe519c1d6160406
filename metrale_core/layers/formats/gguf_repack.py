"""GGUF tensors repacked into the C kernel's records (or the torch path's codes), chunk by chunk.

Owner: ``metrale_core.layers``; :func:`~metrale_core.layers.formats.gguf_linear.gguf_linear`
repacks a projection's tensors at load (or on first use, :class:`PendingRepack`).

Invariants:
- Repacking goes tensor by tensor and row chunk by row chunk (:data:`REPACK_ROWS` rows, up to
  :data:`REPACK_THREADS` chunks at once on as many threads), so the peak extra memory of a load is
  a few chunks' temporaries, never a dequantized matrix; the records are the same in any order.
- Native records go through the repack cache (:mod:`metrale_core.layers.formats.repack_cache`:
  file-backed, evictable), so a lazily repacked MoE expert is paged in only when first used; the
  records are those of an eager repack.
- Types repacked into a wider kind than their own bits (Q2_K, Q3_K, MXFP4) are logged once, with
  the memory cost, as a WARNING.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from attrs import frozen
from loguru import logger

from metrale_core.layers.formats import repack_cache
from metrale_core.layers.formats.gguf_blocks import (
    GGUF_KINDS,
    KIND_SHAPE,
    QK,
    TILE,
    WIDENED,
    decode,
    kind_of,
    pack,
    records_nbytes,
)
from metrale_core.pools import LazyThreadPool

__all__ = ["REPACK_ROWS", "REPACK_THREADS", "PendingRepack", "Repacked", "repack"]

#: Rows decoded and packed at a time while loading (bounds the load's temporaries).
REPACK_ROWS = 1024
#: Chunks repacked at once, on as many threads (at most one per core).
REPACK_THREADS = 4


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
    if quant_type in WIDENED:
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
            list(_REPACK_POOL.get().map(into_records, jobs))  # numpy releases the GIL: chunks side by side
        except BaseException:
            reservation.discard()
            raise
        reservation.commit()
        return Repacked(kind, out_features, in_features, records=torch.from_numpy(flat))

    def one(job: tuple[Any, int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        raw, start, _ = job
        _, codes, d, m = decode(_blocks(raw, slice(start, start + REPACK_ROWS)), quant_type)
        return codes, d, m

    chunks = list(_REPACK_POOL.get().map(one, jobs))
    code_parts, d_parts, m_parts = ([a for part in chunks if (a := part[i]) is not None] for i in range(3))
    return Repacked(
        kind,
        out_features,
        in_features,
        codes=torch.from_numpy(np.concatenate(code_parts)),
        d=torch.from_numpy(np.concatenate(d_parts)),
        m=torch.from_numpy(np.concatenate(m_parts)) if m_parts else None,
    )


#: The threads repacking chunks (one per core, at most :data:`REPACK_THREADS`), made once.
_REPACK_POOL = LazyThreadPool(lambda: min(REPACK_THREADS, os.cpu_count() or 1), "metrale-repack")


_warned: set[str] = set()


def _warn_widened(quant_type: str, kind: int) -> None:
    if quant_type in _warned:
        return
    _warned.add(quant_type)
    bits, sub, has_m = KIND_SHAPE[kind]
    per_weight = (bits * 32 // 8 + 4 * (32 // sub) * (1 + has_m)) / 32
    logger.warning(
        "{} tensors have no kernel of their own: repacked once at load into 8-bit codes with "
        "per-{} float32 scales (exact values, but {:.2f} bytes per weight instead of {:.2f}: "
        "~{:.1f}x the memory and the bandwidth per token of the file's own blocks)",
        quant_type,
        sub,
        per_weight,
        WIDENED[quant_type],
        per_weight / WIDENED[quant_type],
    )


@frozen
class PendingRepack:
    """GGUF tensors not repacked yet (views of the mapped file): :class:`GGUFLinear` repacks them
    on its first call -- an MoE expert is paged in when the router first picks it."""

    raws: tuple[Any, ...]
    native: bool
    out_features: int
