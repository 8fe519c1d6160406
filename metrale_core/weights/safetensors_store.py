"""Hugging Face checkpoint directories: config.json + model.safetensors (or shards with an index).

Owner: ``metrale_core.weights``.  Reads headers of every shard when opened (so a corrupt or
missing file fails at open, naming the file) and tensor data lazily through the memory-mapped
``safetensors.safe_open`` handles.

Invariants:
- Nothing is ever unpickled: ``pytorch_model.bin`` checkpoints are refused with a hint.
- Every name in ``model.safetensors.index.json`` is present in the shard the index names.
- A tensor name appears in exactly one file.
- ``get_raw`` gives each tensor's ``RawSource`` (its file's resolved path, size and modification
  time, its name and shape), so what is derived from it can be cached by it (the HF MXFP4 experts
  repacked for the block kernel: ``weights.mxfp4_hf``, ``layers.repack_cache``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from loguru import logger
from safetensors import safe_open

from metrale_core.errors import CorruptWeightsFile, MissingWeightsFile
from metrale_core.weights.store import RawSource, RawTensor, WeightStore, normalise_config

__all__ = ["SafetensorsStore", "read_json"]

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def read_json(path: Path) -> Any:
    """Parse a JSON file; a missing file -> MissingWeightsFile, bad JSON -> CorruptWeightsFile."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MissingWeightsFile(f"{path} is missing") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CorruptWeightsFile(f"{path} cannot be read: {exc}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CorruptWeightsFile(f"{path} is not valid JSON ({exc}); re-download or fix the file") from exc


class SafetensorsStore(WeightStore):
    """Tensors of a HF checkpoint directory, addressed by their checkpoint names."""

    format = "safetensors"

    def __init__(self, directory: Path) -> None:
        config = read_json(directory / "config.json")
        if not isinstance(config, dict):
            raise CorruptWeightsFile(
                f"{directory / 'config.json'} must hold a JSON object, not {type(config).__name__}"
            )
        weight_map, files = _find_files(directory)
        self._handles: dict[Path, Any] = {f: _open(f) for f in files}
        self._file_of: dict[str, Path] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._dtypes: dict[str, str] = {}
        self._file_ids: dict[Path, tuple[str, int, int]] = {}
        for file, handle in self._handles.items():
            for name in handle.keys():  # noqa: SIM118 -- safe_open handles are not iterable
                if name in self._file_of:
                    raise CorruptWeightsFile(
                        f"tensor {name!r} appears in both {self._file_of[name].name} and {file.name} in {directory}"
                    )
                view = handle.get_slice(name)
                self._file_of[name] = file
                self._shapes[name] = tuple(int(s) for s in view.get_shape())
                self._dtypes[name] = str(view.get_dtype())
        if weight_map is not None:
            for name, shard in weight_map.items():
                if self._file_of.get(name) != directory / shard:
                    raise CorruptWeightsFile(
                        f"{directory / INDEX_FILE} places tensor {name!r} in {shard}, but that file does not hold it"
                    )
        config = normalise_config(config)
        config.setdefault("tie_word_embeddings", "lm_head.weight" not in self._file_of)
        super().__init__(directory, config, list(self._file_of))
        logger.debug("opened {} ({} files, {} tensors)", directory, len(files), len(self._file_of))

    @property
    def tokenizer_dir(self) -> Path | None:
        if any((self.path / f).is_file() for f in _TOKENIZER_FILES):
            return self.path
        return None

    def _shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]

    def _quant_type(self, name: str) -> str:
        return self._dtypes[name]

    def _raw(self, name: str) -> RawTensor:
        shape = self._shapes[name]
        return RawTensor(self._tensor(name), self._dtypes[name], shape, RawSource(*self._file_id(name), name, shape))

    def _file_id(self, name: str) -> tuple[str, int, int]:
        """The file holding ``name``: resolved path, size and modification time (read once)."""
        file = self._file_of[name]
        found = self._file_ids.get(file)
        if found is None:
            st = file.stat()
            found = self._file_ids[file] = (str(file.resolve()), st.st_size, st.st_mtime_ns)
        return found

    def _load(self, name: str) -> tuple[torch.Tensor, bool]:
        # safe_open hands out views of its memory map; the caller gets a copy.
        return self._tensor(name), False

    def _release(self) -> None:
        self._handles.clear()

    def _tensor(self, name: str) -> torch.Tensor:
        file = self._file_of[name]
        try:
            return self._handles[file].get_tensor(name)
        except Exception as exc:  # safetensors raises its own SafetensorError / OSError on bad data
            raise CorruptWeightsFile(f"cannot read tensor {name!r} from {file}: {exc}") from exc


def _find_files(directory: Path) -> tuple[dict[str, str] | None, list[Path]]:
    """(index weight map or None, the safetensors files to open)."""
    index_path = directory / INDEX_FILE
    if index_path.is_file():
        index = read_json(index_path)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise CorruptWeightsFile(f"{index_path} has no valid 'weight_map' object (tensor name -> shard file)")
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (directory / s).is_file()]
        if missing:
            raise MissingWeightsFile(
                f"{directory} is missing shard file(s) named in {INDEX_FILE}: {', '.join(missing)}; "
                "the download is incomplete"
            )
        return weight_map, [directory / s for s in shards]
    if (directory / SINGLE_FILE).is_file():
        return None, [directory / SINGLE_FILE]
    files = sorted(p for p in directory.glob("*.safetensors") if p.is_file())
    if files:
        return None, files
    pickled = [p.name for p in directory.glob("*.bin")] + [p.name for p in directory.glob("*.pt")]
    hint = (
        f"; found pickled PyTorch weights ({', '.join(sorted(pickled))}), which Metrale never loads "
        "(unpickling runs code): convert them to safetensors"
        if pickled
        else ""
    )
    raise MissingWeightsFile(
        f"{directory} has config.json but no weights: expected {SINGLE_FILE}, or {INDEX_FILE} with its "
        f"shards, or other *.safetensors files{hint}"
    )


def _open(file: Path) -> Any:
    try:
        return safe_open(str(file), framework="pt")
    except Exception as exc:  # SafetensorError (bad header, truncated data) or OSError
        raise CorruptWeightsFile(
            f"{file} is not a valid safetensors file ({exc}); it may be truncated or damaged: re-download it"
        ) from exc
