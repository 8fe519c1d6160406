"""The weight-store contract every checkpoint format implements, plus HF config normalisation.

Owner: ``metrale_core.weights``.  Model loaders read tensors only through :class:`WeightStore`;
the format classes (``SafetensorsStore``, ``GGUFStore``) supply names, shapes and raw loads.

Invariants:
- Tensor names are Hugging Face names (``model.layers.3.self_attn.q_proj.weight``) whatever the
  file format, and every tensor is in HF layout (GGUF's llama Q/K row permutation already undone).
- ``get`` returns a fresh, contiguous tensor: the caller may write into it; nothing else sees it.
- A name the store lacks raises ``WeightsError`` naming it; a caller-given shape that differs
  raises ``ShapeMismatch`` naming the tensor and both shapes.  Both happen before any data is read.
- ``config`` is the HF ``config.json`` dict, normalised by :func:`normalise_config` so that
  ``num_key_value_heads``, ``head_dim``, ``rope_theta`` and ``rope_parameters`` are always present
  when the numbers they derive from are.
"""

from __future__ import annotations

import difflib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np
import torch

from metrale_core.errors import ShapeMismatch, WeightsError

__all__ = ["RawSource", "RawTensor", "WeightStore", "normalise_config"]


class RawSource(NamedTuple):
    """Where a raw tensor was read whole from: its file (resolved path, size, modification time)
    and its name and shape there, which identify its bytes (``layers.repack_cache`` keys on it)."""

    path: str
    size: int
    mtime_ns: int
    name: str
    shape: tuple[int, ...]


class RawTensor(NamedTuple):
    """A tensor as stored: GGUF -> (uint8/float numpy array of the encoded rows, GGML type name,
    HF shape); safetensors -> (the torch tensor in its stored dtype, dtype name, shape).

    Rows are in HF order (Q/K permutation undone) but the data may be a read-only view of the
    memory-mapped file: never write into it.
    """

    data: np.ndarray | torch.Tensor
    quant_type: str
    shape: tuple[int, ...]
    #: The whole tensor's origin in a file (a tensor-parallel part: its name names the part,
    #: ``ShardedStore``); None for anything else derived from it.
    source: RawSource | None = None


class WeightStore(ABC):
    """Read-only, lazy access to one checkpoint's tensors by HF name."""

    format: ClassVar[str]
    #: A GGUF store: every ``general.architecture`` it maps -> its HF ``architectures`` entry (the
    #: loader lookup lists those an installed loader serves when it serves none); None otherwise.
    gguf_architectures: ClassVar[Mapping[str, str] | None] = None

    def __init__(self, path: Path, config: dict[str, Any], names: Sequence[str]) -> None:
        self.path = path
        self.config = config
        self._names = tuple(names)
        self._name_set = frozenset(self._names)
        self._closed = False

    # ---- names -------------------------------------------------------------------------------
    def names(self) -> list[str]:
        """Every tensor name (HF naming), in file order."""
        return list(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._name_set

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r}, {len(self)} tensors)"

    # ---- tensors -----------------------------------------------------------------------------
    def shape(self, name: str) -> tuple[int, ...]:
        """The tensor's HF shape, read from the file header (no data is loaded)."""
        self._require(name)
        return self._shape(name)

    def quant_type(self, name: str) -> str:
        """How the tensor is stored: "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", ..."""
        self._require(name)
        return self._quant_type(name)

    def get_raw(self, name: str) -> RawTensor:
        """The tensor's stored encoding, for code that consumes quantized blocks directly."""
        self._require(name)
        return self._raw(name)

    def get(self, name: str, *, dtype: torch.dtype = torch.float32, shape: Sequence[int] | None = None) -> torch.Tensor:
        """The tensor dequantized to ``dtype`` in HF layout; a fresh contiguous tensor."""
        self._require(name)
        actual = self._shape(name)
        if shape is not None and tuple(int(s) for s in shape) != actual:
            raise ShapeMismatch(
                f"tensor {name!r} in {self.path} has shape {list(actual)} but the model expects "
                f"{[int(s) for s in shape]}; the checkpoint does not match its config"
            )
        tensor, owned = self._load(name)
        return tensor.to(dtype=dtype, copy=not owned).contiguous()

    @property
    def gguf_metadata(self) -> dict[str, Any] | None:
        """GGUF key -> python value; None for formats other than GGUF."""
        return None

    @property
    def tokenizer_dir(self) -> Path | None:
        """The directory holding tokenizer.json & co. for HF checkpoints; None otherwise."""
        return None

    # ---- lifetime ----------------------------------------------------------------------------
    def close(self) -> None:
        """Drop the file mappings; any later tensor access raises ``WeightsError``."""
        self._closed = True
        self._release()

    def __enter__(self) -> WeightStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- for subclasses ------------------------------------------------------------------------
    @abstractmethod
    def _shape(self, name: str) -> tuple[int, ...]: ...

    @abstractmethod
    def _quant_type(self, name: str) -> str: ...

    @abstractmethod
    def _raw(self, name: str) -> RawTensor: ...

    @abstractmethod
    def _load(self, name: str) -> tuple[torch.Tensor, bool]:
        """(tensor, owned): ``owned`` is True when no one else holds the tensor's memory."""

    @abstractmethod
    def _release(self) -> None: ...

    def _require(self, name: str) -> None:
        if self._closed:
            raise WeightsError(f"the weight store for {self.path} is closed")
        if name not in self._name_set:
            close = difflib.get_close_matches(name, self._names, n=3)
            hint = f"; similar names: {', '.join(close)}" if close else ""
            raise WeightsError(
                f"tensor {name!r} is not in {self.path} ({len(self._names)} tensors, {self.format}){hint}"
            )


def normalise_config(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of an HF config dict with the derived keys every loader wants filled in.

    ``num_key_value_heads`` defaults to the head count, ``head_dim`` to hidden/heads;
    ``rope_theta`` and ``rope_parameters`` (transformers >= 5 keeps only the latter in config.json)
    are each derived from the other.
    """
    cfg = dict(config)
    heads = cfg.get("num_attention_heads")
    if heads:
        if cfg.get("num_key_value_heads") is None:
            cfg["num_key_value_heads"] = heads
        if cfg.get("head_dim") is None and cfg.get("hidden_size"):
            cfg["head_dim"] = int(cfg["hidden_size"]) // int(heads)
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params and cfg.get("rope_theta") is None:
        cfg["rope_theta"] = params["rope_theta"]
    if cfg.get("rope_theta") is not None and not isinstance(params, dict):
        rope_scaling = cfg.get("rope_scaling")
        scaling = rope_scaling if isinstance(rope_scaling, dict) else {}
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        cfg["rope_parameters"] = {**scaling, "rope_type": rope_type, "rope_theta": cfg["rope_theta"]}
    return cfg
