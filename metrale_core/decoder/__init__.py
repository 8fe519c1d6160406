"""Decoder definitions: one declarative description per decoder family, built by the core.

Owner: ``metrale_core.decoder``.  ``spec`` holds the definition (:class:`DecoderSpec` and its
recipe records), ``names`` the weight-name table (HF and GGUF names); ``dims``, ``weights``,
``model`` and ``build`` turn a definition and a checkpoint into a ``CausalLM`` on
``metrale_core.layers``.  Plugins reach all of it through ``metrale_core.api``; the plugin guide
(``docs/plugin-guide.md``, "A decoder family from the definition") shows a family written this way.

Invariants: importing this package imports no torch (only ``spec`` and ``names``, which need
attrs alone); the builder modules are imported when a model loads.
"""

from __future__ import annotations

from metrale_core.decoder.names import GEMMA_NAMES, LLAMA_NAMES, WeightNames
from metrale_core.decoder.spec import Attention, DecoderSpec, LayerPattern, Mlp, Norms, Scalars

__all__ = [
    "GEMMA_NAMES",
    "LLAMA_NAMES",
    "Attention",
    "DecoderSpec",
    "LayerPattern",
    "Mlp",
    "Norms",
    "Scalars",
    "WeightNames",
]
