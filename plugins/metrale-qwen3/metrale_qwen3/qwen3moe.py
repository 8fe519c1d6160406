"""Metrale model plugin: the Qwen3-MoE decoder (Qwen3-30B-A3B, Qwen3-235B-A22B), one decoder definition.

Owner: ``metrale_qwen3`` (entry point ``qwen3moe``).  Qwen3-MoE is Qwen3 (per-head QK-norm before
RoPE) whose MLP is a mixture of experts: a softmax router over ``num_experts``, the top
``num_experts_per_tok`` experts (their weights renormalised when ``norm_topk_prob``), no shared
expert; ``decoder_sparse_step`` and ``mlp_only_layers`` leave some layers dense.  llama.cpp
writes it as GGUF arch ``qwen3moe`` (experts stacked in ``ffn_*_exps``; it always renormalises).

Invariants: this module imports no torch; the core builds the model when the factory runs
(``metrale_core.layers.blocks.moe``); under tensor parallelism each rank keeps a part of every
expert's width (``metrale_core.decoder.moe_weights.MoeSplit``).
"""

from __future__ import annotations

from metrale_core.api import Attention, DecoderSpec, Mlp, registers

__all__ = ["QWEN3MOE", "metrale_model_loaders"]

QWEN3MOE = DecoderSpec(
    "qwen3moe",
    "Qwen3MoeForCausalLM",
    "Qwen3-MoE decoder (QK-norm, routed experts)",
    model_types=("qwen3_moe", "qwen3moe"),
    attention=Attention(qk_norm="head"),
    mlp=Mlp(kind="moe", bias="never"),
)


metrale_model_loaders = registers(QWEN3MOE.loader_spec())
