"""Every tensor of a small GGUF file (a llama.cpp LoRA adapter, say) as float32, with HF names.

Owner: ``metrale_core.weights``; plugins reach it as ``metrale_core.api.read_gguf_tensors``.
:class:`~metrale_core.weights.gguf_store.GGUFStore` serves model checkpoints (it needs a model's
metadata to build a config); this reads files that are not whole models, such as adapters
written by llama.cpp's ``convert_lora_to_gguf.py``, whose tensors are named
``blk.N.attn_q.weight.lora_a``.

Invariants:
- The file is checked as ``GGUFStore`` checks it (magic, readability, byte order, every
  tensor's extent), so a damaged file fails with ``CorruptWeightsFile`` naming it.
- Shapes are numpy (HF) order: the GGUF dims reversed.  Values are dequantized float32, rows
  exactly as stored: llama's Q/K row permutation is not undone here (the caller knows the head
  count; :attr:`GGUFTensors.rows_permuted` says whether it applies).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from attrs import frozen

from metrale_core.weights.gguf_dequant import dequantize
from metrale_core.weights.gguf_file import check_tensor_extent, field_value, is_scalar_field, open_gguf
from metrale_core.weights.gguf_hf import PERMUTED_ARCHS, hf_name

__all__ = ["GGUFTensors", "read_gguf_tensors"]


@frozen
class GGUFTensors:
    """The metadata and tensors of one GGUF file."""

    path: Path
    #: Scalar metadata (``general.architecture``, ``adapter.lora.alpha``, ...).
    metadata: dict[str, object]
    #: GGUF tensor name -> float32 array in numpy (HF) shape.
    tensors: dict[str, np.ndarray]

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    @property
    def rows_permuted(self) -> bool:
        """Whether llama.cpp's converter permuted the Q/K rows (``unpermute_rows`` undoes it)."""
        return self.architecture in PERMUTED_ARCHS

    @staticmethod
    def hf_name(gguf_name: str) -> str | None:
        """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight`` (None if unknown)."""
        return hf_name(gguf_name)


def read_gguf_tensors(path: str | Path) -> GGUFTensors:
    """Read and dequantize every tensor of the GGUF file at ``path``."""
    path = Path(path)
    reader = open_gguf(path)
    size = path.stat().st_size
    tensors: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        check_tensor_extent(path, t, shape, size)
        tensors[t.name] = dequantize(t.data, t.tensor_type, shape)
    metadata = {k: field_value(path, k, f) for k, f in reader.fields.items() if is_scalar_field(f)}
    return GGUFTensors(path, metadata, tensors)
