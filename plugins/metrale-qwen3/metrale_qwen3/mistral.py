"""Metrale model plugin: the Mistral decoder (Mistral 7B, Mistral-Nemo), one decoder definition.

Owner: ``metrale_qwen3`` (entry point ``mistral``).  Mistral is Llama with a sliding window over
every layer (the config's ``sliding_window``; null in Mistral-Nemo and later) and an explicit
``head_dim`` (Nemo: 128 with hidden 5120 / 32 heads), which the definition reads from the config.
No projection has a bias.  llama.cpp writes Mistral checkpoints as GGUF arch ``llama``, so a GGUF
of one loads through the ``llama`` definition (its ``attention.key_length`` is the head_dim).

Invariants: this module imports no torch; the core builds the model when the factory runs.
"""

from __future__ import annotations

from metrale_core.api import Attention, DecoderSpec, LayerPattern, Mlp, registers

__all__ = ["MISTRAL", "metrale_model_loaders"]

MISTRAL = DecoderSpec(
    "mistral",
    "MistralForCausalLM",
    "Mistral / Mistral-Nemo decoder (sliding window, explicit head_dim)",
    attention=Attention(qkv_bias="never", o_bias="never"),
    mlp=Mlp(bias="never"),
    layers=LayerPattern(sliding_window="sliding_window"),
)


metrale_model_loaders = registers(MISTRAL.loader_spec())
