"""Opening a GGUF file: a fast reader of its header, and the checks every reader of one runs
before touching its tensors.

Owner: ``metrale_core.weights``; used by ``gguf_store`` (model checkpoints), ``gguf_tensors``
(adapters and other files that are not whole models) and the tokenizer (GGUF metadata).

:class:`GGUFFile` parses the header itself rather than through ``gguf.GGUFReader``: that reader
builds a numpy view per array element, which took 15 s for Gemma 3's 262k-token vocabulary (three
arrays of 262k entries) before a single tensor was touched; this one reads each numeric array
with one ``frombuffer`` and each string array in one pass over the bytes (0.3 s).  It keeps the
reader's shapes: ``fields`` (name -> :class:`GGUFField` with ``types`` and ``contents()``),
``tensors`` (:class:`GGUFTensor` with ``name``, ``tensor_type``, GGUF-order ``shape``,
``data_offset`` and ``data``, a view of the memory-mapped file in the reader's dtype and shape).

Invariants:
- The file is memory-mapped read-only; tensor ``data`` are views of that one mapping (no copy).
- ``open_gguf`` fails with ``CorruptWeightsFile`` naming the file for anything that is not a
  readable little-endian GGUF; ``check_tensor_extent`` for a tensor whose bytes (by its type and
  shape) run past the file's end, so later reads cannot run off the mapping.
- ``field_value`` gives float32 metadata its shortest decimal form (0.1, not 0.10000000149).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
from attrs import frozen
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.quants import quant_shape_to_byte_shape

from metrale_core.errors import CorruptWeightsFile
from metrale_core.weights.gguf_dequant import tensor_nbytes

__all__ = [
    "GGUF_MAGIC",
    "PSEUDO_FIELDS",
    "GGUFField",
    "GGUFFile",
    "GGUFTensor",
    "check_tensor_extent",
    "field_value",
    "is_scalar_field",
    "open_gguf",
]

GGUF_MAGIC = b"GGUF"
#: Fields GGUFReader adds to a file's own metadata (the header counts), not written by the converter.
PSEUDO_FIELDS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")


_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32
#: Scalar value types -> numpy dtype (little-endian).
_SCALARS: dict[int, np.dtype] = {
    GGUFValueType.UINT8: np.dtype("<u1"),
    GGUFValueType.INT8: np.dtype("<i1"),
    GGUFValueType.UINT16: np.dtype("<u2"),
    GGUFValueType.INT16: np.dtype("<i2"),
    GGUFValueType.UINT32: np.dtype("<u4"),
    GGUFValueType.INT32: np.dtype("<i4"),
    GGUFValueType.FLOAT32: np.dtype("<f4"),
    GGUFValueType.BOOL: np.dtype("?"),
    GGUFValueType.UINT64: np.dtype("<u8"),
    GGUFValueType.INT64: np.dtype("<i8"),
    GGUFValueType.FLOAT64: np.dtype("<f8"),
}
#: Tensor types stored as plain numbers (every other type: raw bytes, ``[..., row bytes]``).
_PLAIN: dict[GGMLQuantizationType, type[np.generic]] = {
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


@frozen
class GGUFField:
    """One metadata key: its value types (``[ARRAY, element type]`` for arrays) and value."""

    name: str
    types: list[GGUFValueType]
    value: Any
    #: Elements of an array (1 for a scalar).
    count: int = 1

    def contents(self) -> Any:
        """The value: a python scalar, a ``str``, or a list of them for an array."""
        return self.value


@frozen
class GGUFTensor:
    """One tensor's header entry and its bytes in the mapping."""

    name: str
    tensor_type: GGMLQuantizationType
    #: GGUF dims, fastest first (numpy shape = reversed).
    shape: np.ndarray
    n_elements: int
    n_bytes: int
    data_offset: int
    data: np.ndarray


class _Cursor:
    """Sequential little-endian reads over the header bytes; reading past the end is a ValueError."""

    def __init__(self, buf: np.ndarray) -> None:
        self.buf = buf
        self.mem = memoryview(buf)  # type: ignore[arg-type]
        self.offset = 0

    def take(self, n: int) -> int:
        start = self.offset
        if n < 0 or start + n > len(self.mem):
            raise ValueError(f"the header runs past the end of the file at byte {start} (+{n})")
        self.offset = start + n
        return start

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        return struct.unpack_from(fmt, self.mem, self.take(size))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        start = self.take(n)
        return str(self.mem[start : start + n], "utf-8")

    def strings(self, count: int) -> list[str]:
        mem, out, offset, end = self.mem, [], self.offset, len(self.mem)
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            if offset + 8 > end:
                raise ValueError(f"a string array runs past the end of the file at byte {offset}")
            (n,) = unpack(mem, offset)
            offset += 8
            if offset + n > end:
                raise ValueError(f"a string array runs past the end of the file at byte {offset}")
            out.append(str(mem[offset : offset + n], "utf-8"))
            offset += n
        self.offset = offset
        return out

    def array(self, dtype: np.dtype, count: int) -> np.ndarray:
        start = self.take(dtype.itemsize * count)
        return np.frombuffer(self.buf, dtype=dtype, count=count, offset=start)

    def value(self, kind: int) -> tuple[list[GGUFValueType], Any, int]:
        if kind == GGUFValueType.STRING:
            return [GGUFValueType.STRING], self.string(), 1
        if kind == GGUFValueType.ARRAY:
            sub, count = self.unpack("<I"), self.unpack("<Q")
            if sub == GGUFValueType.STRING:
                return [GGUFValueType.ARRAY, GGUFValueType.STRING], self.strings(count), count
            if sub == GGUFValueType.ARRAY:
                inner = [self.value(GGUFValueType.ARRAY) for _ in range(count)]
                types = [GGUFValueType.ARRAY, *(inner[0][0] if inner else [GGUFValueType.ARRAY])]
                return types, [value for _, value, _ in inner], count
            if sub not in _SCALARS:
                raise ValueError(f"unknown GGUF array element type {sub}")
            return [GGUFValueType.ARRAY, GGUFValueType(sub)], self.array(_SCALARS[sub], count).tolist(), count
        if kind not in _SCALARS:
            raise ValueError(f"unknown GGUF value type {kind}")
        return [GGUFValueType(kind)], self.array(_SCALARS[kind], 1)[0].item(), 1


class GGUFFile:
    """The parsed header of one GGUF file over its read-only memory mapping (see the module)."""

    byte_order = "I"

    def __init__(self, path: Path | str) -> None:
        #: The whole file, mapped read-only (``data._mmap`` is the mapping).
        self.data = np.memmap(path, mode="r")
        cur = _Cursor(self.data)
        if bytes(cur.mem[:4]) != GGUF_MAGIC:
            raise ValueError("GGUF magic invalid")
        cur.take(4)
        version = cur.unpack("<I")
        if version & 0xFFFF == 0:
            self.byte_order = "S"  # written on a big-endian machine: refused by open_gguf
            return
        if version not in _VERSIONS:
            raise ValueError(f"GGUF version {version} is not supported (only {_VERSIONS})")
        tensor_count, kv_count = cur.unpack("<Q"), cur.unpack("<Q")
        self.fields: dict[str, GGUFField] = {
            "GGUF.version": GGUFField("GGUF.version", [GGUFValueType.UINT32], version),
            "GGUF.tensor_count": GGUFField("GGUF.tensor_count", [GGUFValueType.UINT64], tensor_count),
            "GGUF.kv_count": GGUFField("GGUF.kv_count", [GGUFValueType.UINT64], kv_count),
        }
        for _ in range(kv_count):
            key = cur.string()
            types, value, count = cur.value(cur.unpack("<I"))
            self.fields[key] = GGUFField(key, types, value, count)
        infos = []
        for _ in range(tensor_count):
            name = cur.string()
            n_dims = cur.unpack("<I")
            dims = cur.array(np.dtype("<u8"), n_dims).copy()
            infos.append((name, dims, cur.unpack("<I"), cur.unpack("<Q")))
        alignment = _DEFAULT_ALIGNMENT
        field = self.fields.get("general.alignment")
        if field is not None:
            alignment = field.value
            if field.types != [GGUFValueType.UINT32] or alignment <= 0 or alignment & (alignment - 1):
                raise ValueError(f"general.alignment {alignment!r} is not a power of two (uint32)")
        start = -(-cur.offset // alignment) * alignment
        self.data_offset = start
        self.tensors: list[GGUFTensor] = []
        seen: set[str] = set()
        for name, dims, raw_type, offset in infos:
            if name in seen:
                raise ValueError(f"two tensors are named {name}")
            seen.add(name)
            self.tensors.append(self._tensor(name, dims, GGMLQuantizationType(raw_type), start + int(offset)))

    def _tensor(self, name: str, dims: np.ndarray, kind: GGMLQuantizationType, offset: int) -> GGUFTensor:
        n_elements = int(np.prod(dims))
        block, type_size = GGML_QUANT_SIZES[kind]
        n_bytes = n_elements * type_size // block
        np_dims = tuple(int(d) for d in reversed(dims.tolist()))
        raw = self.data[offset : offset + n_bytes]
        plain = _PLAIN.get(kind)
        if len(raw) < n_bytes:  # truncated: left flat for check_tensor_extent to report
            data = raw
        elif plain is not None:
            data = raw.view(plain).reshape(np_dims)
        else:
            data = raw.reshape(quant_shape_to_byte_shape(np_dims, kind))
        return GGUFTensor(name, kind, dims, n_elements, n_bytes, offset, data)


def open_gguf(path: Path) -> GGUFFile:
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
        reader = GGUFFile(path)
    except Exception as exc:  # ValueError/UnicodeDecodeError/KeyError/... on bad files
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
