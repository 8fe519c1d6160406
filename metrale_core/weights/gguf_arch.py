"""Arch-specific GGUF metadata (and small tensors) -> the HF config keys the decoder definitions read.

Owner: ``metrale_core.weights`` (``gguf_hf.synthesize_config`` calls :func:`arch_config` once per
open, after the llama-shaped keys every arch shares).

Invariants:
- Granite's multipliers and Gemma 2's window and soft-caps are copied from ``{arch}.<key>``
  (``_ARCH_KEYS``) when the file has them; a Gemma 2 file gets its activation and
  ``query_pre_attn_scalar`` as llama.cpp reads them (the 27B, 46 layers, scales by hidden / heads).
- Gemma 3 as llama.cpp reads it: its window, window pattern (every k-th layer global) and final
  soft-cap from the metadata, the sliding layers' RoPE base 10,000, the softmax scale as Gemma 2's
  rule (the 27B, 62 layers, by hidden / heads), and ``eos_token_id`` the file's EOS plus its end
  of turn (``tokenizer.ggml.eot_token_id``, else the token ``<end_of_turn>``).
- Phi-3 (llama.cpp's ``Phi3MiniModel``): ``attention.sliding_window`` is the window (0: none, as
  Phi-4-mini writes it), ``rope.dimension_count`` below ``head_dim`` is ``partial_rotary_factor``,
  ``rope.scaling.original_context_length`` is ``original_max_position_embeddings``, and the
  tensors ``rope_factors_short`` / ``rope_factors_long`` (with ``rope.scaling.attn_factor``) are a
  ``longrope`` ``rope_scaling`` -- the converter writes no ``rope.scaling.type`` for them.
- The MoE archs (qwen3moe, qwen2moe) get their expert count, top-k and expert widths
  (``_MOE_KEYS``) and ``norm_topk_prob`` from ``expert_weights_norm``, else llama.cpp's default
  for the arch (``_NORM_TOPK``: always for qwen3moe, never for qwen2moe).
- DeepSeek-V2 (``deepseek2``, llama.cpp's ``DeepseekV2Model``, V3 too): the latent ranks, the
  no-rope / rope / value head dims (``key_length_mla`` / ``value_length_mla`` in the files with
  ``attn_k_b`` / ``attn_v_b``, else ``key_length`` / ``value_length``), the leading dense
  layers, the shared experts, ``expert_weights_scale`` / ``_norm``, the expert groups, the
  gating function (2: sigmoid, with the ``exp_probs_b`` bias: ``topk_method`` ``noaux_tc``),
  and YaRN's ``yarn_log_multiplier`` as ``mscale`` = ``mscale_all_dim`` (llama.cpp's reading).
- gpt-oss (llama.cpp's ``GptOssModel``): the window is ``attention.sliding_window`` (every second
  layer slides, from layer 0, as llama.cpp's ``swa_pattern`` 2), the expert width
  ``expert_feed_forward_length`` is gpt-oss's ``intermediate_size``, and a YaRN ``rope_scaling``
  gets ``rope.scaling.yarn_beta_fast`` / ``yarn_beta_slow`` and ``truncate`` (llama.cpp floors
  and ceils the correction range, ``ggml_rope_yarn_corr_dims``).
- :data:`CONFIG_TENSORS` are the only tensors read while a config is made (1-D, a few floats each);
  they stay names of the store as well.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

__all__ = ["CONFIG_TENSORS", "arch_config", "metadata_config"]

#: GGUF tensors whose values are config (Phi-3's LongRoPE factors, llama3 scaling's frequency divisors).
CONFIG_TENSORS = ("rope_factors_short.weight", "rope_factors_long.weight", "rope_freqs.weight")

#: The experts' keys of an MoE arch: HF config key -> GGUF metadata key.
_MOE_KEYS = {
    "num_experts": "expert_count",
    "num_experts_per_tok": "expert_used_count",
    "moe_intermediate_size": "expert_feed_forward_length",
}
#: Per arch: HF config key -> its GGUF metadata key (without the ``{arch}.`` prefix).
_ARCH_KEYS = {
    "granite": {
        "embedding_multiplier": "embedding_scale",
        "residual_multiplier": "residual_scale",
        "attention_multiplier": "attention.scale",
        "logits_scaling": "logit_scale",
    },
    "gemma2": {
        "sliding_window": "attention.sliding_window",
        "attn_logit_softcapping": "attn_logit_softcapping",
        "final_logit_softcapping": "final_logit_softcapping",
    },
    "gemma3": {
        "sliding_window": "attention.sliding_window",
        "sliding_window_pattern": "attention.sliding_window_pattern",
        "final_logit_softcapping": "final_logit_softcapping",
    },
    "qwen3moe": _MOE_KEYS,
    "gpt-oss": {
        "num_experts": "expert_count",
        "num_experts_per_tok": "expert_used_count",
        "intermediate_size": "expert_feed_forward_length",
        "sliding_window": "attention.sliding_window",
    },
    "qwen2moe": {**_MOE_KEYS, "shared_expert_intermediate_size": "expert_shared_feed_forward_length"},
    "deepseek2": {
        **_MOE_KEYS,
        "kv_lora_rank": "attention.kv_lora_rank",
        "q_lora_rank": "attention.q_lora_rank",
        "qk_rope_head_dim": "rope.dimension_count",
        "first_k_dense_replace": "leading_dense_block_count",
        "n_shared_experts": "expert_shared_count",
        "routed_scaling_factor": "expert_weights_scale",
        "n_group": "expert_group_count",
        "topk_group": "expert_group_used_count",
    },
}
#: Per MoE arch: whether llama.cpp renormalises the top-k weights (``norm_topk_prob``) when the
#: file does not say (``expert_weights_norm``).
_NORM_TOPK = {"qwen3moe": True, "qwen2moe": False, "deepseek2": False}
#: Gemma: the layer count of the size whose softmax scale llama.cpp takes as hidden / heads (Gemma
#: 2 27B, Gemma 3 27B; every other size: ``head_dim``).
_GEMMA_BIG = {"gemma2": 46, "gemma3": 62}
#: The sliding layers' RoPE base of a gemma3 file (llama.cpp's constant; the file holds none).
_GEMMA3_LOCAL_THETA = 10_000.0


def arch_config(
    arch: str,
    scalars: Mapping[str, Any],
    tensors: Mapping[str, np.ndarray],
    config: dict[str, Any],
    token_id: Callable[[str], int | None] | None = None,
) -> None:
    """Add ``arch``'s own keys to ``config`` (llama-shaped already) from its metadata ``scalars``
    and the :data:`CONFIG_TENSORS` the file has (``tensors``, by GGUF name); ``token_id(text)``
    finds a token of the file's vocabulary (None: not there)."""
    for hf_key, gguf_key in _ARCH_KEYS.get(arch, {}).items():
        if f"{arch}.{gguf_key}" in scalars:
            config[hf_key] = scalars[f"{arch}.{gguf_key}"]
    if arch in _NORM_TOPK:
        config["norm_topk_prob"] = bool(scalars.get(f"{arch}.expert_weights_norm", _NORM_TOPK[arch]))
    if arch in _GEMMA_BIG:
        config["hidden_act"] = "gelu_pytorch_tanh"
        big = config["num_hidden_layers"] == _GEMMA_BIG[arch]
        config["query_pre_attn_scalar"] = (
            config["hidden_size"] // config["num_attention_heads"] if big else config["head_dim"]
        )
    if arch == "gemma3":
        config["rope_local_base_freq"] = _GEMMA3_LOCAL_THETA
        config["eos_token_id"] = _with_end_of_turn(scalars, config.get("eos_token_id"), token_id)
    if arch == "phi3":
        _phi3(scalars, tensors, config)
    scaling = config.get("rope_scaling")
    if arch == "gpt-oss" and scaling and scaling.get("rope_type") == "yarn":
        for hf_key in ("beta_fast", "beta_slow"):
            value = scalars.get(f"{arch}.rope.scaling.yarn_{hf_key}")
            if value is not None:
                scaling[hf_key] = float(value)
        scaling["truncate"] = True
    if arch == "deepseek2":
        _deepseek2(scalars, config)
    freqs = tensors.get("rope_freqs.weight")
    if freqs is not None and not config.get("rope_scaling"):
        # llama.cpp's converter writes llama3 scaling (Llama 3.1 / 3.2) as one divisor per
        # frequency, with no rope.scaling keys: theta_j = base ** (-2j / dim) / factors[j]
        config["rope_scaling"] = {"rope_type": "freq_factors", "factors": [float(x) for x in freqs.reshape(-1)]}


def _deepseek2(scalars: Mapping[str, Any], config: dict[str, Any]) -> None:
    def key(name: str) -> Any:
        return scalars.get(f"deepseek2.{name}")

    rope = int(config.get("qk_rope_head_dim") or 0)
    split = key("attention.key_length_mla") is not None  # attn_k_b / attn_v_b: head_count_kv is 1
    qk = key("attention.key_length_mla") if split else key("attention.key_length")
    value = key("attention.value_length_mla") if split else key("attention.value_length")
    if qk is not None:
        config["qk_nope_head_dim"] = int(qk) - rope
    if value is not None:
        config["v_head_dim"] = int(value)
    config["num_key_value_heads"] = config["num_attention_heads"]
    config["head_dim"] = rope
    if key("expert_gating_func") == 2:
        config["scoring_func"], config["topk_method"] = "sigmoid", "noaux_tc"
    elif config.get("n_group") and int(config["n_group"]) > 1:
        config["topk_method"] = "group_limited_greedy"
    log_multiplier = key("rope.scaling.yarn_log_multiplier")
    scaling = config.get("rope_scaling")
    if scaling and log_multiplier:
        scaling["mscale"] = scaling["mscale_all_dim"] = float(log_multiplier) / 0.1


def _with_end_of_turn(scalars: Mapping[str, Any], eos: Any, token_id: Callable[[str], int | None] | None) -> list[int]:
    """The file's EOS and its end of turn (``tokenizer.ggml.eot_token_id``, else the token
    ``<end_of_turn>``): Gemma's chat turns end with the latter, not with EOS."""
    ids = [] if eos is None else [int(e) for e in (eos if isinstance(eos, list) else [eos])]
    eot = scalars.get("tokenizer.ggml.eot_token_id")
    if eot is None and token_id is not None:
        eot = token_id("<end_of_turn>")
    if eot is not None and int(eot) not in ids:
        ids.append(int(eot))
    return ids


def metadata_config(config: Mapping[str, Any], metadata: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` (llama-shaped, as the GGUF store synthesizes it) plus the arch's own keys from a
    file's whole ``metadata`` (arrays included: the vocabulary for ``token_id``)."""
    out = dict(config)
    tokens = metadata.get("tokenizer.ggml.tokens") or []

    def token_id(text: str) -> int | None:
        return next((i for i, t in enumerate(tokens) if t == text), None)

    arch_config(str(metadata.get("general.architecture")), metadata, {}, out, token_id)
    return out


def _phi3(scalars: Mapping[str, Any], tensors: Mapping[str, np.ndarray], config: dict[str, Any]) -> None:
    config["sliding_window"] = int(scalars.get("phi3.attention.sliding_window") or 0) or None
    rotary = scalars.get("phi3.rope.dimension_count")
    if rotary is not None and int(rotary) != config["head_dim"]:
        config["partial_rotary_factor"] = int(rotary) / config["head_dim"]
    original = scalars.get("phi3.rope.scaling.original_context_length")
    if original is not None:
        config["original_max_position_embeddings"] = int(original)
    short, long = (tensors.get(name) for name in CONFIG_TENSORS[:2])
    if short is None or long is None:
        return
    scaling: dict[str, Any] = {
        "rope_type": "longrope",
        "short_factor": [float(x) for x in short.reshape(-1)],
        "long_factor": [float(x) for x in long.reshape(-1)],
    }
    if original is not None:
        scaling["original_max_position_embeddings"] = int(original)
    if "phi3.rope.scaling.attn_factor" in scalars:
        scaling["attention_factor"] = float(scalars["phi3.rope.scaling.attn_factor"])
    config["rope_scaling"] = scaling
