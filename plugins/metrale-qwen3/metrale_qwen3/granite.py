"""Metrale model plugin: the IBM Granite 3 dense decoder, one decoder definition.

Owner: ``metrale_qwen3`` (entry point ``granite``).  Granite is Llama with four config scalars
(transformers' ``GraniteForCausalLM``): the token embeddings times ``embedding_multiplier``, each
branch times ``residual_multiplier`` before its residual add, the softmax scale
``attention_multiplier`` (instead of ``head_dim ** -0.5``) and the logits divided by
``logits_scaling``.  GGUF arch ``granite`` (llama.cpp's ``GraniteModel``, a ``LlamaModel``: Q/K
rows permuted, undone by the GGUF store) carries them as ``granite.embedding_scale``,
``residual_scale``, ``attention.scale`` and ``logit_scale``.

Invariants: this module imports no torch; the core builds the model when the factory runs.
"""

from __future__ import annotations

from metrale_core.api import Attention, DecoderSpec, Scalars, registers

__all__ = ["GRANITE", "metrale_model_loaders"]

GRANITE = DecoderSpec(
    "granite",
    "GraniteForCausalLM",
    "IBM Granite 3 dense decoder (embedding / residual / attention / logits multipliers)",
    attention=Attention(scale="attention_multiplier"),
    scalars=Scalars(embedding="embedding_multiplier", residual="residual_multiplier", logits="logits_scaling"),
)


metrale_model_loaders = registers(GRANITE.loader_spec())
