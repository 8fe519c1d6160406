"""``gguf_arch.arch_config``: Phi-3's and Gemma 3's metadata as llama.cpp writes it -> the HF config keys.

The full path (a Phi-3 GGUF through the engine, against transformers) is
plugins/metrale-qwen3/tests/test_dense_families.py; here the conventions a small config cannot
show: Phi-4-mini's window 0 (none) and a file without LongRoPE factors (Phi-3-mini-4k).
"""

from __future__ import annotations

import numpy as np

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
