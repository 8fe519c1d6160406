"""Metrale model plugin: the DeepSeek-V2 decoder (DeepSeek-V2, V2-Lite, V2.5) and its V3 relative.

Owner: ``metrale_qwen3`` (entry point ``deepseek2``; two definitions, one per HF architecture).
DeepSeek-V2 is the Llama layer with two changes, both the core's: multi-head latent attention
(``Attention(kind="mla")``: an optional low-rank q, one normalised latent of ``kv_lora_rank``
plus a rope key shared by every head, DeepSeek's YaRN with ``mscale_all_dim`` in the softmax
scale) and DeepSeek's MoE
(``Mlp(kind="moe")``: a softmax router, group-limited greedy top-k over ``n_group`` /
``topk_group``, ``routed_scaling_factor``, ``n_shared_experts`` shared experts fused into one,
the first ``first_k_dense_replace`` layers dense).  llama.cpp writes it as GGUF arch
``deepseek2`` (``attn_kv_a_mqa``, ``attn_kv_b`` or its halves ``attn_k_b`` / ``attn_v_b``,
``attn_q_a`` / ``attn_q_b``, ``ffn_*_exps``, ``ffn_*_shexp``), and writes DeepSeek-V3 under the
same arch (sigmoid gating, ``exp_probs_b``): the metadata says which routing, and the core
reads the correction bias wherever the config's ``topk_method`` is ``noaux_tc``.  ``deepseek3``
(HF ``DeepseekV3ForCausalLM``) is the same decoder with V3's router: sigmoid scores, the
correction bias ``e_score_correction_bias``, groups ranked by their two best biased scores.

Invariants: this module imports no torch; the core builds the model when the factory runs;
tensor parallelism is refused (latent attention and experts are not sharded yet).  A config's
``norm_topk_prob`` renormalises the top-k before the scaling factor (llama.cpp's order; every
released V2 config sets it false, where transformers, which ignores it, agrees).
"""

from __future__ import annotations

from metrale_core.api import LLAMA_NAMES, Attention, DecoderSpec, Mlp, registers

__all__ = ["DEEPSEEK2", "DEEPSEEK3", "metrale_model_loaders"]

#: DeepSeek's names: the shared experts are ``shared_experts`` (plural).
_NAMES = LLAMA_NAMES.replace(
    **{
        f"shared_{p}": (f"model.layers.{{i}}.mlp.shared_experts.{p}_proj", f"blk.{{i}}.ffn_{p}_shexp")
        for p in ("gate", "up", "down")
    }
)

DEEPSEEK2 = DecoderSpec(
    "deepseek2",
    "DeepseekV2ForCausalLM",
    "DeepSeek-V2 decoder (multi-head latent attention, group-limited routed and shared experts)",
    model_types=("deepseek_v2", "deepseek2"),
    attention=Attention(kind="mla"),
    mlp=Mlp(kind="moe", bias="never", shared_experts=True),
    names=_NAMES,
)
DEEPSEEK3 = DecoderSpec(
    "deepseek3",
    "DeepseekV3ForCausalLM",
    "DeepSeek-V3 decoder (latent attention, sigmoid routing with a correction bias, shared experts)",
    model_types=("deepseek_v3",),
    attention=Attention(kind="mla"),
    mlp=Mlp(kind="moe", bias="never", shared_experts=True, scoring="sigmoid", router_bias=True),
    names=_NAMES,
)


metrale_model_loaders = registers(DEEPSEEK2.loader_spec(), DEEPSEEK3.loader_spec())
