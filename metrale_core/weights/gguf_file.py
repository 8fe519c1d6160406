"""Opening a GGUF file safely: the checks every reader of one runs before touching its tensors.

Owner: ``metrale_core.weights``; used by ``gguf_store`` (model checkpoints) and ``gguf_tensors``
(adapters and other files that are not whole models).

Invariants:
- ``open_gguf`` fails with ``CorruptWeightsFile`` naming the file for anything that is not a
  readable little-endian GGUF; ``check_tensor_extent`` for a tensor whose bytes (by its type and
  shape) run past the file's end, so later reads cannot run off the mapping.
- ``field_value`` gives float32 metadata its shortest decimal form (0.1, not 0.10000000149).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFReader, GGUFValueType

from metrale_core.errors import CorruptWeightsFile
from metrale_core.weights.gguf_dequant import tensor_nbytes

__all__ = ["GGUF_MAGIC", "PSEUDO_FIELDS", "check_tensor_extent", "field_value", "is_scalar_field", "open_gguf"]

GGUF_MAGIC = b"GGUF"
#: Fields GGUFReader adds to a file's own metadata (the header counts), not written by the converter.
PSEUDO_FIELDS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")


def open_gguf(path: Path) -> GGUFReader:
    """The reader of the GGUF file at ``path`` (memory-mapped read-only), checked as the module says."""
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


def check_tensor_extent(path: Path, t: Any, shape: tuple[int, ...], file_size: int) -> None:
    """Fail unless tensor ``t`` (numpy ``shape``) is of a known type and lies wholly in the file."""
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


def is_scalar_field(field: Any) -> bool:
    """A metadata field of one value written by the converter (not an array, not a header count)."""
    return bool(field.types) and field.types[0] != GGUFValueType.ARRAY and field.name not in PSEUDO_FIELDS


def field_value(path: Path, key: str, field: Any) -> Any:
    """A metadata field as a python value; float32 scalars get their shortest decimal form."""
    try:
        value = field.contents()
    except UnicodeDecodeError as exc:
        raise CorruptWeightsFile(f"{path}: GGUF metadata {key} holds text that is not UTF-8 ({exc})") from exc
    if field.types == [GGUFValueType.FLOAT32]:
        value = float(str(np.float32(value)))
    return value
