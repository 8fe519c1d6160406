"""Metrale model plugin: the Gemma 2 decoder, one decoder definition.

Owner: ``metrale_qwen3`` (entry point ``gemma2``).  Gemma 2 (transformers' ``Gemma2ForCausalLM``):
``(1 + w)`` RMSNorms before and after attention and the MLP, a GeGLU MLP (tanh-gelu gate), token
embeddings times ``sqrt(hidden_size)``, the softmax scale ``query_pre_attn_scalar ** -0.5``,
attention logits soft-capped at ``attn_logit_softcapping`` and the final logits at
``final_logit_softcapping``, and sliding layers alternating with global ones (``layer_types``,
else every second layer global) over ``sliding_window`` positions.  Weight names: the core's
Gemma table (``GEMMA_NAMES``: HF ``pre_feedforward_layernorm`` is the pre-MLP norm, GGUF
``ffn_norm``).  GGUF arch ``gemma2``: llama.cpp's converter stores norms as ``1 + w`` (read as
plain weights) and Q/K unpermuted; the GGUF store fills the config from its metadata.

Invariants: this module imports no torch; the core builds the model when the factory runs.
"""

from __future__ import annotations

from metrale_core.api import GEMMA_NAMES, Attention, DecoderSpec, LayerPattern, Mlp, Norms, Scalars, registers

__all__ = ["GEMMA2", "metrale_model_loaders"]

GEMMA2 = DecoderSpec(
    "gemma2",
    "Gemma2ForCausalLM",
    "Gemma 2 decoder (soft-capping, alternating sliding windows, GeGLU)",
    norms=Norms(post_attn=True, post_mlp=True, unit_offset=True),
    attention=Attention(softcap="attn_logit_softcapping", scale="query_pre_attn_scalar**-0.5"),
    mlp=Mlp(kind="geglu", bias="never"),
    layers=LayerPattern(sliding_window="sliding_window", global_every=2),
    scalars=Scalars(embedding="hidden_size**0.5", final_softcap="final_logit_softcapping"),
    names=GEMMA_NAMES,
    activations=("gelu_pytorch_tanh", "gelu_tanh"),
)


metrale_model_loaders = registers(GEMMA2.loader_spec())
