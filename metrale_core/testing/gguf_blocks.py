"""GGUF files of random but valid blocks of every block type, for the tests of the GGUF formats.

Owner: the tests of ``metrale_core.layers.formats`` (``gguf_blocks``, ``gguf_repack``,
``gguf_linear``).  Invariants: deterministic (seeded); every fp16 (super-)scale field holds a
sane value (random bytes elsewhere), so decoding gives finite weights that
``gguf.quants.dequantize`` (:func:`dequantized`, the oracle) agrees on.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize

from metrale_core.layers.formats.gguf_blocks import GGUF_KINDS
from metrale_core.weights.gguf_store import GGUFStore

__all__ = ["dequantized", "random_blocks", "raw_of", "write_block_types", "write_tensors"]

#: Byte offsets of the fp16 (super-)scale fields in one block of each type.
_SCALE_FIELDS = {
    "Q4_0": [0],
    "Q4_1": [0, 2],
    "Q5_0": [0],
    "Q5_1": [0, 2],
    "Q8_0": [0],
    "Q4_K": [0, 2],
    "Q5_K": [0, 2],
    "Q6_K": [208],
    "Q2_K": [80, 82],
    "Q3_K": [108],
    "IQ4_NL": [0],
    "IQ4_XS": [0],
    "MXFP4": [],  # its scale is one E8M0 byte: set below
}


def random_blocks(quant_type: str, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Random valid blocks of ``quant_type`` ``[n, row_bytes]``: random bytes with every fp16
    (super-)scale field set to a sane random value."""
    _, per_block, size = GGUF_KINDS[quant_type]
    blocks = rng.integers(0, 256, size=(n, k // per_block, size), dtype=np.uint8)
    if quant_type == "MXFP4":  # 2^-10 .. 2^-4 (the spec's extremes: test_mxfp4)
        blocks[..., 0] = rng.integers(118, 124, size=blocks.shape[:2], dtype=np.uint8)
    for off in _SCALE_FIELDS[quant_type]:
        scale = rng.uniform(0.2, 1.0, size=blocks.shape[:2]) * rng.choice([1e-3, 1e-2], size=blocks.shape[:2])
        blocks[..., off : off + 2] = scale.astype("<f2")[..., None].view(np.uint8)
    return blocks.reshape(n, -1)


def write_tensors(path: Path, tensors: Iterable[tuple[str, np.ndarray, GGMLQuantizationType]], k: int) -> Path:
    """A one-block llama GGUF at ``path`` (embedding length ``k``) holding ``(name, raw blocks,
    block type)`` of ``tensors``, written in order; returns ``path``."""
    writer = GGUFWriter(str(path), "llama")
    writer.add_embedding_length(k)
    writer.add_head_count(8)
    writer.add_block_count(1)
    writer.add_context_length(64)
    for name, blocks, kind in tensors:
        writer.add_tensor(name, blocks, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_block_types(path: Path, types: Iterable[str], n: int, k: int, seed: int = 0) -> GGUFStore:
    """A GGUF at ``path`` with one ``[n, k]`` tensor ``blk.0.<type>.weight`` per block type."""
    rng = np.random.default_rng(seed)
    tensors = ((f"blk.0.{t}.weight", random_blocks(t, n, k, rng), GGMLQuantizationType[t]) for t in types)
    return GGUFStore(write_tensors(path, tensors, k))


def raw_of(store: GGUFStore, quant_type: str) -> Any:
    """The raw tensor of block type ``quant_type`` in a :func:`write_block_types` file."""
    return store.get_raw(next(n for n, g in store.gguf_names.items() if g == f"blk.0.{quant_type}.weight"))


def dequantized(raw: Any) -> np.ndarray:
    """``raw``'s float32 values as ``gguf.quants`` decodes them (the oracle)."""
    return dequantize(np.asarray(raw.data), GGMLQuantizationType[raw.quant_type]).reshape(raw.shape)
