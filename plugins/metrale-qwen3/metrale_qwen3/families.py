"""The decoder definitions of the Llama / Qwen2 / Qwen3 family, one per registered loader.

Owner: ``metrale_qwen3``; ``__init__.metrale_model_loaders`` registers each one's
``loader_spec()``.  The core builds them (``metrale_core.api.DecoderSpec``): config reading,
weights in every format, tensor parallelism, LoRA and the forward are the definition's.

Invariants: what differs between the three is only what is written here -- Qwen3 normalises q and
k per head before RoPE; Qwen2 has q/k/v biases whatever the config says and never an o_proj bias;
Llama is the definition's default.  This module imports no torch.
"""

from __future__ import annotations

from metrale_core.api import Attention, DecoderSpec

__all__ = ["FAMILIES", "LLAMA", "QWEN2", "QWEN3"]

QWEN3 = DecoderSpec(
    "qwen3", "Qwen3ForCausalLM", "Qwen3 dense decoder (QK-norm, GQA)", attention=Attention(qk_norm="head")
)
LLAMA = DecoderSpec("llama", "LlamaForCausalLM", "Llama decoder (Llama 2 / 3, SmolLM2)")
QWEN2 = DecoderSpec(
    "qwen2",
    "Qwen2ForCausalLM",
    "Qwen2 / Qwen2.5 decoder (q/k/v bias)",
    attention=Attention(qkv_bias="always", o_bias="never"),
)

#: In registration order.
FAMILIES = (QWEN3, LLAMA, QWEN2)
