"""``gguf_arch.arch_config``: Phi-3's, DeepSeek-V2's and Gemma 3's metadata as llama.cpp writes it -> HF keys.

The full path (a Phi-3 GGUF through the engine, against transformers) is
plugins/metrale-qwen3/tests/test_dense_families.py; here the conventions a small config cannot
show: Phi-4-mini's window 0 (none) and a file without LongRoPE factors (Phi-3-mini-4k).
"""

from __future__ import annotations

import numpy as np
import pytest

from metrale_core.weights.gguf_arch import arch_config, metadata_config


def _phi3(scalars, tensors):
    config = {"head_dim": 128, "max_position_embeddings": 131072}
    arch_config("phi3", scalars, tensors, config)
    return config


def test_phi4_mini_window_zero_is_none_and_partial_rotary_and_longrope():
    factors = {
        "rope_factors_short.weight": np.ones(48, dtype=np.float32),
        "rope_factors_long.weight": np.full(48, 2.0, dtype=np.float32),
    }
    scalars = {
        "phi3.attention.sliding_window": 0,
        "phi3.rope.dimension_count": 96,
        "phi3.rope.scaling.original_context_length": 4096,
        "phi3.rope.scaling.attn_factor": 1.19,
    }
    config = _phi3(scalars, factors)
    assert config["sliding_window"] is None and config["partial_rotary_factor"] == 0.75
    assert config["original_max_position_embeddings"] == 4096
    assert config["rope_scaling"] == {
        "rope_type": "longrope",
        "short_factor": [1.0] * 48,
        "long_factor": [2.0] * 48,
        "original_max_position_embeddings": 4096,
        "attention_factor": 1.19,
    }


def test_phi3_mini_4k_has_a_window_and_no_rope_scaling():
    config = _phi3({"phi3.attention.sliding_window": 2047, "phi3.rope.dimension_count": 128}, {})
    assert config["sliding_window"] == 2047
    assert "partial_rotary_factor" not in config and "rope_scaling" not in config


def _gemma3(scalars, layers=26, token_id=None):
    config = {"num_hidden_layers": layers, "hidden_size": 640, "num_attention_heads": 4, "head_dim": 256}
    config["eos_token_id"] = 1
    arch_config("gemma3", scalars, {}, config, token_id)
    return config


def test_gemma3_reads_its_window_pattern_and_local_base_and_scales_as_llama_cpp():
    config = _gemma3({"gemma3.attention.sliding_window": 512, "gemma3.attention.sliding_window_pattern": 6})
    assert (config["sliding_window"], config["sliding_window_pattern"]) == (512, 6)
    assert config["rope_local_base_freq"] == 10_000.0 and config["hidden_act"] == "gelu_pytorch_tanh"
    assert config["query_pre_attn_scalar"] == 256  # head_dim
    assert _gemma3({}, layers=62)["query_pre_attn_scalar"] == 160  # the 27B: hidden / heads


def test_gemma3_end_of_turn_joins_eos_from_its_key_else_by_text():
    assert _gemma3({"tokenizer.ggml.eot_token_id": 106})["eos_token_id"] == [1, 106]
    assert _gemma3({}, token_id={"<end_of_turn>": 7}.get)["eos_token_id"] == [1, 7]
    assert _gemma3({}, token_id=lambda text: None)["eos_token_id"] == [1]
    assert _gemma3({"tokenizer.ggml.eot_token_id": 1})["eos_token_id"] == [1]  # EOS itself: once


def test_metadata_config_adds_the_arch_keys_from_a_whole_metadata():
    meta = {"general.architecture": "gemma3", "tokenizer.ggml.tokens": ["<pad>", "<eos>", "<end_of_turn>"]}
    config = {"num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 2, "head_dim": 4, "eos_token_id": 1}
    out = metadata_config(config, meta)
    assert out["eos_token_id"] == [1, 2] and config["eos_token_id"] == 1  # a copy


def _deepseek2(scalars):
    config = {"num_attention_heads": 16, "rope_scaling": {"rope_type": "yarn", "factor": 40.0}}
    arch_config("deepseek2", {f"deepseek2.{k}": v for k, v in scalars.items()}, {}, config)
    return config


def test_deepseek2_v2_lite_metadata_as_llama_cpp_writes_it_with_split_kv_b():
    """The newer converter's MQA view (``head_count_kv`` 1, ``key_length`` = latent + rope) gives
    the HF head dims back from ``*_length_mla``; YaRN's log multiplier is both mscales."""
    config = _deepseek2(
        {
            "attention.kv_lora_rank": 512,
            "attention.key_length": 576,
            "attention.value_length": 512,
            "attention.key_length_mla": 192,
            "attention.value_length_mla": 128,
            "rope.dimension_count": 64,
            "leading_dense_block_count": 1,
            "expert_count": 64,
            "expert_used_count": 6,
            "expert_shared_count": 2,
            "expert_feed_forward_length": 1408,
            "expert_weights_scale": 1.0,
            "expert_gating_func": 1,
            "rope.scaling.yarn_log_multiplier": 0.0707,
        }
    )
    assert (config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"]) == (128, 64, 128)
    assert (config["num_key_value_heads"], config["head_dim"], config["kv_lora_rank"]) == (16, 64, 512)
    assert (config["first_k_dense_replace"], config["n_shared_experts"], config["num_experts"]) == (1, 2, 64)
    assert config["norm_topk_prob"] is False and "scoring_func" not in config and "q_lora_rank" not in config
    assert config["rope_scaling"]["mscale"] == config["rope_scaling"]["mscale_all_dim"] == pytest.approx(0.707)


def test_deepseek2_v3_gating_is_sigmoid_with_the_correction_bias_and_groups():
    config = _deepseek2(
        {
            "attention.key_length": 192,
            "attention.value_length": 128,
            "rope.dimension_count": 64,
            "expert_gating_func": 2,
            "expert_group_count": 8,
            "expert_group_used_count": 4,
            "expert_weights_norm": True,
            "expert_weights_scale": 2.5,
        }
    )
    assert (config["scoring_func"], config["topk_method"], config["norm_topk_prob"]) == ("sigmoid", "noaux_tc", True)
    assert (config["n_group"], config["topk_group"], config["routed_scaling_factor"]) == (8, 4, 2.5)
    assert (config["qk_nope_head_dim"], config["v_head_dim"]) == (128, 128)


def test_rope_freqs_tensor_is_the_llama3_scaling_llamacpp_wrote():
    """llama.cpp's converter writes a Llama 3.1 / 3.2 config's llama3 RoPE scaling as the tensor
    ``rope_freqs.weight`` (one divisor per frequency, no rope.scaling keys): the config gets it as
    ``freq_factors``, and the tables divide each default frequency by its factor."""
    import torch

    from metrale_core.decoder.dims import DecoderDims
    from metrale_core.decoder.rope import RopeTables
    from metrale_core.decoder.spec import DecoderSpec

    factors = np.array([1.0, 1.0, 2.5, 8.0], dtype=np.float32)
    config: dict = {}
    arch_config("llama", {}, {"rope_freqs.weight": factors}, config)
    assert config["rope_scaling"] == {"rope_type": "freq_factors", "factors": [1.0, 1.0, 2.5, 8.0]}
    hf = dict(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4, intermediate_size=64,
        vocab_size=16, max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0, **config,
    )  # fmt: skip
    tables = RopeTables(DecoderDims.from_config(hf, DecoderSpec("llama", "LlamaForCausalLM")), torch.device("cpu"))
    default = 1.0 / 10000.0 ** (torch.arange(0, 8, 2).float() / 8)
    assert torch.allclose(tables.inv_freq, default / torch.from_numpy(factors), rtol=1e-6)
