"""``open_weights``: pick the store class for a checkpoint path.

Owner: ``metrale_core.weights``.

Invariants:
- A directory with config.json is a Hugging Face checkpoint (``SafetensorsStore``); a directory
  without one but with exactly one ``*.gguf`` file opens that file; a file starting with the GGUF
  magic (or named ``*.gguf``) is a ``GGUFStore``.  Anything else raises a ``WeightsError``
  subclass saying what was expected.
"""

from __future__ import annotations

import os
from pathlib import Path

from loguru import logger

from metrale_core.errors import CorruptWeightsFile, MissingWeightsFile, WeightsError
from metrale_core.weights.gguf_store import GGUF_MAGIC, GGUFStore
from metrale_core.weights.safetensors_store import SafetensorsStore
from metrale_core.weights.store import WeightStore

__all__ = ["open_weights"]


def open_weights(path: str | os.PathLike[str]) -> WeightStore:
    """Open a HF checkpoint directory or a .gguf file; tensors are read lazily later."""
    p = Path(path).expanduser()
    if not p.exists():
        raise MissingWeightsFile(f"weights path {p} does not exist")
    if p.is_dir():
        if (p / "config.json").is_file():
            return SafetensorsStore(p)
        ggufs = sorted(q for q in p.glob("*.gguf") if q.is_file())
        if len(ggufs) == 1:
            logger.info("{} has no config.json; opening its only GGUF file {}", p, ggufs[0].name)
            return GGUFStore(ggufs[0])
        found = f"; it holds several .gguf files ({', '.join(q.name for q in ggufs)}): pass one" if ggufs else ""
        raise MissingWeightsFile(
            f"{p} has no config.json: expected a Hugging Face checkpoint directory "
            f"(config.json + *.safetensors) or a .gguf file{found}"
        )
    try:
        with p.open("rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise CorruptWeightsFile(f"{p} cannot be read: {exc}") from exc
    if magic == GGUF_MAGIC or p.suffix.lower() == ".gguf":
        return GGUFStore(p)
    if p.suffix.lower() in (".safetensors", ".json"):
        raise WeightsError(f"{p} is one file of a Hugging Face checkpoint: pass its directory {p.parent} instead")
    raise WeightsError(
        f"{p} is neither a checkpoint directory nor a GGUF file: pass a directory with config.json "
        "and *.safetensors, or a .gguf file"
    )
