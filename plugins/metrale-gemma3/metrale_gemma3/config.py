"""Checkpoint config -> Gemma 3 dimensions, as its definition reads them.

Owner: ``metrale_gemma3``.  :class:`Gemma3Dims` keeps the plugin's name for its config reading
(its tests and users call ``Gemma3Dims.from_config`` / ``from_gguf``); both return the core's
``DecoderDims`` of the ``GEMMA3`` definition, the object the loaded model runs on (``model.dims``).

Invariants: no reading of its own -- an HF config through ``DecoderSpec.dims``, a GGUF's through
the same with the file's metadata (the keys the GGUF store adds); this module imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from metrale_gemma3 import GEMMA3

__all__ = ["Gemma3Dims"]


class Gemma3Dims:
    """The dims of a Gemma 3 checkpoint (a ``DecoderDims``); see the module docstring."""

    @staticmethod
    def from_config(config: Mapping[str, Any]) -> Any:
        """Dims of an HF ``gemma3_text`` config (or a ``gemma3`` one's ``text_config``)."""
        return GEMMA3.dims(config)

    @staticmethod
    def from_gguf(config: Mapping[str, Any], meta: Mapping[str, Any]) -> Any:
        """Dims of a ``gemma3`` GGUF: the store's llama-shaped config and the file's metadata."""
        return GEMMA3.dims(config, gguf_metadata=meta)
