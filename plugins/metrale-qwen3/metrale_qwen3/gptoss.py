"""Metrale model plugin: the gpt-oss decoder (gpt-oss-20b, gpt-oss-120b), one decoder definition.

Owner: ``metrale_qwen3`` (entry point ``gptoss``, loader ``gpt-oss``).  gpt-oss (transformers'
``GptOssForCausalLM``) is a pre-norm decoder with q/k/v/o biases, a learned sink logit per head
in every attention softmax (``self_attn.sinks``), sliding layers alternating with full ones
(``layer_types``, else every second layer full) over ``sliding_window`` positions, YaRN RoPE, and
an MoE MLP in every layer: a router with a bias whose top-k logits are chosen first and
softmaxed over those k, experts with biases, and a clamped SwiGLU (``swiglu_limit``,
``swiglu_alpha``; ``(up + 1) * gate * sigmoid(alpha * gate)``) whose experts are ``intermediate_size``
wide.

Weight names: transformers stacks a layer's experts (``mlp.experts.gate_up_proj`` ``[E, D, 2I]``,
gate and up interleaved column by column, ``down_proj`` ``[E, I, D]``, their ``*_bias``); the
table reads expert ``e``'s gate as ``gate_up_proj[e][0::2].T`` (``metrale_core.weights``'
expert slices).  llama.cpp's converter (GGUF arch ``gpt-oss``) writes them de-interleaved as
``ffn_{gate,up,down}_exps`` (weights, usually MXFP4, and ``[E, rows]`` biases), the pre-MLP norm
as ``post_attention_norm`` and the sinks as ``attn_sinks``.  The official HF checkpoints store the
experts in MXFP4 (``gate_up_proj_blocks`` / ``_scales``, ``quantization_config`` ``mxfp4``): the
core serves the same names from those as GGUF MXFP4 blocks (``metrale_core.weights.mxfp4_hf``).

Invariants: this module imports no torch; the core builds the model when the factory runs;
tensor parallelism is refused (sinks and experts are not split between ranks).  The harmony chat
format is not this module's.
"""

from __future__ import annotations

from metrale_core.api import LLAMA_NAMES, Attention, DecoderSpec, LayerPattern, Mlp, registers

__all__ = ["GPTOSS", "metrale_model_loaders"]

_EXPERTS = "model.layers.{i}.mlp.experts."

GPTOSS = DecoderSpec(
    "gpt-oss",
    "GptOssForCausalLM",
    "gpt-oss decoder (attention sinks, alternating sliding windows, biased top-k experts, MXFP4 in GGUF or HF)",
    model_types=("gpt_oss", "gpt-oss"),
    attention=Attention(sinks=True),
    mlp=Mlp(
        kind="moe",
        bias="always",
        scoring="topk_softmax",
        norm_topk="never",
        expert_width="intermediate_size",
        expert_act="swiglu_oai",
    ),
    layers=LayerPattern(sliding_window="sliding_window", global_every=2),
    names=LLAMA_NAMES.replace(
        mlp_norm=("model.layers.{i}.post_attention_layernorm", "blk.{i}.post_attention_norm"),
        router=("model.layers.{i}.mlp.router", "blk.{i}.ffn_gate_inp"),
        expert_gate=(_EXPERTS + "gate_up_proj{suffix}[{e}][0::2].T", "blk.{i}.ffn_gate_exps"),
        expert_up=(_EXPERTS + "gate_up_proj{suffix}[{e}][1::2].T", "blk.{i}.ffn_up_exps"),
        expert_down=(_EXPERTS + "down_proj{suffix}[{e}].T", "blk.{i}.ffn_down_exps"),
    ),
    default_eps=1e-5,
)


metrale_model_loaders = registers(GPTOSS.loader_spec())
