"""GGUF files (llama.cpp's format) read through ``gguf.GGUFReader``, presented with HF names.

Owner: ``metrale_core.weights``.  The reader memory-maps the file read-only; tensors are
dequantized (``gguf_dequant``) one at a time on ``get``.

Invariants:
- A file that is not GGUF, is truncated or whose tensor data runs past its end fails at open with
  ``CorruptWeightsFile`` naming the file; every tensor's byte size is checked against its type and
  shape there, so later reads cannot run off the mapping.
- Numpy shape = reversed GGUF dims (GGUF lists the fastest dimension first).
- For ``llama`` files, q_proj/k_proj rows (weights and biases) come back in HF order.
- A file without ``output.weight`` has tied embeddings: config ``tie_word_embeddings`` is True and
  ``lm_head.weight`` is not a name of the store.
"""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGUFReader, GGUFValueType
from loguru import logger

from metrale_core.errors import CorruptWeightsFile, WeightsError
from metrale_core.weights.gguf_dequant import dequantize, tensor_nbytes
from metrale_core.weights.gguf_hf import ARCHITECTURES, hf_name, permute_heads, synthesize_config, unpermute_rows
from metrale_core.weights.store import RawTensor, WeightStore, normalise_config

__all__ = ["GGUF_MAGIC", "GGUFStore"]

GGUF_MAGIC = b"GGUF"
_PSEUDO_FIELDS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")


class GGUFStore(WeightStore):
    """Tensors of one .gguf file under HF names, dequantized to float on ``get``."""

    format = "gguf"

    def __init__(self, path: Path) -> None:
        reader = _read(path)
        #: None once released (:meth:`_release`).
        self._reader: GGUFReader | None = reader
        self._metadata: dict[str, Any] | None = None
        size = path.stat().st_size
        shapes: dict[str, tuple[int, ...]] = {}
        for t in reader.tensors:
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            _check_extent(path, t, shape, size)
            shapes[t.name] = shape
        scalars = {k: _value(path, k, f) for k, f in reader.fields.items() if _is_scalar(f)}
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        config = normalise_config(
            synthesize_config(str(path), scalars, len(tokens.data) if tokens is not None else None, shapes)
        )
        self._arch = str(config["model_type"])
        if self._arch not in ARCHITECTURES:
            logger.warning(
                "{}: GGUF architecture {!r} is not one of {}; tensor names are mapped with the llama table "
                "and Q/K rows are left as stored",
                path,
                self._arch,
                sorted(ARCHITECTURES),
            )
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
        super().__init__(path, config, list(self._by_name))
        logger.debug("opened {} (arch {}, {} tensors)", path, self._arch, len(self._by_name))

    @property
    def gguf_metadata(self) -> dict[str, Any]:
        if self._metadata is None:
            if self._reader is None:
                raise WeightsError(f"the weight store for {self.path} is closed")
            self._metadata = {
                k: _value(self.path, k, f) for k, f in self._reader.fields.items() if k not in _PSEUDO_FIELDS
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
        return RawTensor(data, t.tensor_type.name, self._shapes[name])

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
        read (a token-table row kept in place) maps its page again from the page cache."""
        mm = getattr(getattr(self._reader, "data", None), "_mmap", None)
        if mm is not None and hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            mm.madvise(mmap.MADV_DONTNEED)

    def _release(self) -> None:
        self._reader = None
        self._by_name = dict.fromkeys(self._by_name)


def _read(path: Path) -> GGUFReader:
    try:
        with path.open("rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise CorruptWeightsFile(f"{path} cannot be read: {exc}") from exc
    if magic != GGUF_MAGIC:
        raise CorruptWeightsFile(
            f"{path} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r}); "
            "the file is damaged or of another format"
        )
    try:
        reader = GGUFReader(path, "r")
    except Exception as exc:  # GGUFReader fails with ValueError/IndexError/KeyError/... on bad files
        raise CorruptWeightsFile(
            f"{path} is not a readable GGUF file ({type(exc).__name__}: {exc}); "
            f"it is probably truncated or damaged ({path.stat().st_size} bytes): re-download it"
        ) from exc
    if reader.byte_order != "I":
        raise CorruptWeightsFile(f"{path} is a big-endian GGUF file; only little-endian files are supported")
    return reader


def _check_extent(path: Path, t: Any, shape: tuple[int, ...], file_size: int) -> None:
    if t.tensor_type not in GGML_QUANT_SIZES:
        raise CorruptWeightsFile(f"{path}: tensor {t.name} has unknown GGML type {t.tensor_type}")
    try:
        nbytes = tensor_nbytes(t.tensor_type, shape)
    except ValueError as exc:
        raise CorruptWeightsFile(f"{path}: tensor {t.name} of shape {list(shape)}: {exc}") from exc
    end = int(t.data_offset) + nbytes
    if end > file_size or int(t.data.nbytes) != nbytes:
        raise CorruptWeightsFile(
            f"{path}: tensor {t.name} needs bytes {t.data_offset}..{end} but the file has {file_size} bytes; "
            "the file is truncated: re-download it"
        )


def _is_scalar(field: Any) -> bool:
    return bool(field.types) and field.types[0] != GGUFValueType.ARRAY and field.name not in _PSEUDO_FIELDS


def _value(path: Path, key: str, field: Any) -> Any:
    """A metadata field as a python value; float32 scalars get their shortest decimal form."""
    try:
        value = field.contents()
    except UnicodeDecodeError as exc:
        raise CorruptWeightsFile(f"{path}: GGUF metadata {key} holds text that is not UTF-8 ({exc})") from exc
    if field.types == [GGUFValueType.FLOAT32]:
        value = float(str(np.float32(value)))
    return value
