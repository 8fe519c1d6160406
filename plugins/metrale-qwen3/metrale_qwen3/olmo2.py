"""Metrale model plugin: the OLMo 2 decoder, written as one decoder definition.

Owner: ``metrale_qwen3`` (entry point ``olmo2``); the worked example of the plugin guide's
"A decoder family from the definition".  OLMo 2 differs from Llama in its block recipe alone:
no pre-norms, an RMSNorm on the output of attention and of the MLP before each residual add, and
a QK-norm over the whole q and k projections (weights ``[heads * head_dim]``) before RoPE.  Its
weight names are the table's defaults (HF ``post_attention_layernorm`` /
``post_feedforward_layernorm``; GGUF ``post_attention_norm`` / ``post_ffw_norm``, Q/K rows not
permuted by llama.cpp's converter).

Invariants: this module imports no torch (the core builds the model when the factory runs);
tensor parallelism is refused with the definition's reason (the whole-projection QK-norm).
"""

from __future__ import annotations

from metrale_core.api import Attention, DecoderSpec, Mlp, Norms, registers

__all__ = ["OLMO2", "metrale_model_loaders"]

OLMO2 = DecoderSpec(
    "olmo2",
    "Olmo2ForCausalLM",
    "OLMo 2 decoder (post-norms, QK-norm over the projections)",
    norms=Norms(pre_attn=False, post_attn=True, pre_mlp=False, post_mlp=True),
    attention=Attention(qk_norm="proj"),
    mlp=Mlp(bias="never"),
)


metrale_model_loaders = registers(OLMO2.loader_spec())
