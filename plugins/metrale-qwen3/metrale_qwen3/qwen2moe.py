"""Metrale model plugin: the Qwen2-MoE decoder (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B), one decoder definition.

Owner: ``metrale_qwen3`` (entry point ``qwen2moe``).  Qwen2-MoE is Qwen2 (q/k/v biases, no
o_proj bias) whose MLP is a mixture of experts: a softmax router, the top ``num_experts_per_tok``
experts (renormalised when ``norm_topk_prob``) plus one shared expert of width
``shared_expert_intermediate_size``, whose output is scaled by ``sigmoid(shared_expert_gate(x))``.
llama.cpp writes it as GGUF arch ``qwen2moe`` (``ffn_*_exps``, ``ffn_*_shexp``,
``ffn_gate_inp_shexp``).

Invariants: this module imports no torch; the core builds the model when the factory runs
(``metrale_core.layers.blocks.moe``); under tensor parallelism each rank keeps a part of every
expert's width (``metrale_core.decoder.moe_weights.MoeSplit``).
"""

from __future__ import annotations

from metrale_core.api import Attention, DecoderSpec, Mlp, registers

__all__ = ["QWEN2MOE", "metrale_model_loaders"]

QWEN2MOE = DecoderSpec(
    "qwen2moe",
    "Qwen2MoeForCausalLM",
    "Qwen2-MoE decoder (q/k/v bias, routed experts and a gated shared expert)",
    model_types=("qwen2_moe", "qwen2moe"),
    attention=Attention(qkv_bias="always", o_bias="never"),
    mlp=Mlp(kind="moe", bias="never", shared_experts=True, shared_gate=True),
)


metrale_model_loaders = registers(QWEN2MOE.loader_spec())
