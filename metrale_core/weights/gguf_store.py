"""GGUF files (llama.cpp's format) read through ``gguf_file.GGUFFile``, presented with HF names.

Owner: ``metrale_core.weights``.  The reader memory-maps the file read-only; tensors are
dequantized (``gguf_dequant``) one at a time on ``get``.

Invariants:
- A file that is not GGUF, is truncated or whose tensor data runs past its end fails at open with
  ``CorruptWeightsFile`` naming the file; every tensor's byte size is checked against its type and
  shape there, so later reads cannot run off the mapping.
- Numpy shape = reversed GGUF dims (GGUF lists the fastest dimension first); a 1-D row vector HF
  stores as ``[1, D]`` is served as that (``gguf_hf.hf_shape``).
- For ``llama`` files, q_proj/k_proj rows (weights and biases) come back in HF order.
- A file of an architecture the store does not map opens (tensor names through the llama table,
  Q/K rows as stored, the config keys its metadata has); the loader lookup then refuses it in one
  line listing ``gguf_architectures`` an installed loader serves (``Registry.find_model_loader``).
- A file without ``output.weight`` has tied embeddings: config ``tie_word_embeddings`` is True and
  ``lm_head.weight`` is not a name of the store.
"""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import Any

import numpy as np
import torch
from loguru import logger

from metrale_core.errors import CorruptWeightsFile, WeightsError
from metrale_core.weights.gguf_arch import CONFIG_TENSORS
from metrale_core.weights.gguf_dequant import dequantize
from metrale_core.weights.gguf_file import (
    GGUF_MAGIC,
    PSEUDO_FIELDS,
    GGUFFile,
    check_tensor_extent,
    field_value,
    is_scalar_field,
    open_gguf,
)
from metrale_core.weights.gguf_hf import (
    ARCHITECTURES,
    hf_name,
    hf_shape,
    permute_heads,
    synthesize_config,
    unpermute_rows,
)
from metrale_core.weights.store import RawSource, RawTensor, WeightStore, normalise_config

__all__ = ["GGUF_MAGIC", "GGUFStore"]  # GGUF_MAGIC re-exported from gguf_file


class GGUFStore(WeightStore):
    """Tensors of one .gguf file under HF names, dequantized to float on ``get``."""

    format = "gguf"
    gguf_architectures = ARCHITECTURES

    def __init__(self, path: Path) -> None:
        reader = open_gguf(path)
        #: None once released (:meth:`_release`).
        self._reader: GGUFFile | None = reader
        self._metadata: dict[str, Any] | None = None
        size = path.stat().st_size
        shapes: dict[str, tuple[int, ...]] = {}
        for t in reader.tensors:
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            check_tensor_extent(path, t, shape, size)
            shapes[t.name] = hf_shape(t.name, shape)
        scalars = {k: field_value(path, k, f) for k, f in reader.fields.items() if is_scalar_field(f)}
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        small = {  # the few 1-D tensors whose values are config (Phi-3's LongRoPE factors)
            t.name: dequantize(t.data, t.tensor_type, shapes[t.name])
            for t in reader.tensors
            if t.name in CONFIG_TENSORS
        }

        def token_id(text: str) -> int | None:
            vocab = field_value(path, "tokenizer.ggml.tokens", tokens) if tokens is not None else []
            return next((i for i, t in enumerate(vocab) if t == text), None)

        config = normalise_config(
            synthesize_config(str(path), scalars, tokens.count if tokens is not None else None, shapes, small, token_id)
        )
        self._arch = str(config["model_type"])
        self._by_name: dict[str, Any] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._heads: dict[str, int] = {}
        for t in reader.tensors:
            name = hf_name(t.name) or t.name
            if name in self._by_name:
                raise CorruptWeightsFile(f"{path}: two GGUF tensors map to the HF name {name!r} (second: {t.name})")
            self._by_name[name] = t
            self._shapes[name] = shapes[t.name]
            heads = permute_heads(self._arch, t.name, config)
            if heads is not None:
                if shapes[t.name][0] % (2 * heads):
                    raise CorruptWeightsFile(
                        f"{path}: {t.name} has {shapes[t.name][0]} rows, not a multiple of 2 x {heads} heads"
                    )
                self._heads[name] = heads
        st = path.stat()
        #: (resolved path, size, mtime) of the file, the identity of every tensor read from it.
        self._file_id = (str(path.resolve()), st.st_size, st.st_mtime_ns)
        super().__init__(path, config, list(self._by_name))
        logger.debug("opened {} (arch {}, {} tensors)", path, self._arch, len(self._by_name))

    @property
    def gguf_metadata(self) -> dict[str, Any]:
        if self._metadata is None:
            if self._reader is None:
                raise WeightsError(f"the weight store for {self.path} is closed")
            self._metadata = {
                k: field_value(self.path, k, f) for k, f in self._reader.fields.items() if k not in PSEUDO_FIELDS
            }
        return self._metadata

    @property
    def gguf_names(self) -> dict[str, str]:
        """HF name -> the tensor's name inside the GGUF file."""
        return {name: t.name for name, t in self._by_name.items()}

    def _shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]

    def _quant_type(self, name: str) -> str:
        return self._by_name[name].tensor_type.name

    def _raw(self, name: str) -> RawTensor:
        t = self._by_name[name]
        data = t.data
        if name in self._heads:
            data = unpermute_rows(np.asarray(data), self._heads[name])
        shape = self._shapes[name]
        return RawTensor(data, t.tensor_type.name, shape, RawSource(*self._file_id, name, shape))

    def _load(self, name: str) -> tuple[torch.Tensor, bool]:
        t = self._by_name[name]
        try:
            values = dequantize(t.data, t.tensor_type, self._shapes[name])
        except NotImplementedError as exc:
            raise WeightsError(
                f"tensor {name!r} ({t.name}) in {self.path} uses GGML type {t.tensor_type.name}, "
                f"which cannot be dequantized here: {exc}"
            ) from exc
        if name in self._heads:
            values = unpermute_rows(values, self._heads[name])
        return torch.from_numpy(values), True

    def drop_resident_pages(self) -> None:
        """Let the OS take back the mapped file's pages (``MADV_DONTNEED``): after a load that
        repacked every tensor, the file's pages no longer count in the process's memory; a later
        read (a token-table row kept in place, an MoE expert repacked on its first use) maps its
        page again from the page cache."""
        mm = getattr(getattr(self._reader, "data", None), "_mmap", None)
        if mm is not None and hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            mm.madvise(mmap.MADV_DONTNEED)

    def _release(self) -> None:
        self._reader = None
        self._by_name = dict.fromkeys(self._by_name)
