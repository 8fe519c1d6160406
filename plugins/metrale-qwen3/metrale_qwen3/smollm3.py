"""Metrale model plugin: the SmolLM3 decoder, one decoder definition.

Owner: ``metrale_qwen3`` (entry point ``smollm3``).  SmolLM3 is Llama with NoPE layers: every
fourth layer (the config's ``no_rope_layers`` list, else ``no_rope_layer_interval``) attends
without rotating q and k; with ``use_sliding_window`` its ``layer_types`` name sliding layers
(the config derives them from the NoPE ones).  GGUF arch ``smollm3`` (llama.cpp's
``SmolLM3Model``, a ``LlamaModel``: Q/K rows permuted, undone by the GGUF store; every fourth
layer NoPE, as llama.cpp reads it).

Invariants: this module imports no torch; the core builds the model when the factory runs.
"""

from __future__ import annotations

from metrale_core.api import DecoderSpec, LayerPattern, registers

__all__ = ["SMOLLM3", "metrale_model_loaders"]

SMOLLM3 = DecoderSpec(
    "smollm3",
    "SmolLM3ForCausalLM",
    "SmolLM3 decoder (NoPE every 4th layer)",
    layers=LayerPattern(sliding_window="sliding_window", nope_every=4),
)


metrale_model_loaders = registers(SMOLLM3.loader_spec())
