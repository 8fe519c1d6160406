"""Which parser reads an adapter path: a ``.gguf`` file is a llama.cpp LoRA adapter, anything
else a PEFT adapter directory.

Owner: ``metrale_lora``; :func:`adapter_loader` gives the bank its loader
(``metrale_engine_started``), bound to the base model's head size.

Invariants: the choice depends on the path alone (a file ending in ``.gguf``), so an error
names the format the user meant; both parsers return float32 ``AdapterWeights`` in HF module
names, checked against the base by the bank.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metrale_core.api import AdapterWeights

__all__ = ["adapter_loader", "load_adapter"]


def load_adapter(path: str | Path, head_dim: int | None = None) -> AdapterWeights:
    """Parse the adapter at ``path`` (PEFT directory or llama.cpp ``.gguf``)."""
    if str(path).lower().endswith(".gguf"):
        from metrale_lora.gguf_format import load_gguf_lora

        return load_gguf_lora(path, head_dim)
    from metrale_lora.peft_format import load_peft

    return load_peft(path)


def adapter_loader(model: Any) -> Callable[[str], AdapterWeights]:
    """The loader for adapters on ``model`` (its attention head size from ``model.info.kv``)."""
    kv = getattr(getattr(model, "info", None), "kv", None)
    return functools.partial(load_adapter, head_dim=getattr(kv, "head_dim", None))
