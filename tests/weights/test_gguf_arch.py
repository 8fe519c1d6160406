"""``gguf_arch.arch_config``: Phi-3's metadata as llama.cpp's converter writes it -> the HF config keys.

The full path (a Phi-3 GGUF through the engine, against transformers) is
plugins/metrale-qwen3/tests/test_dense_families.py; here the conventions a small config cannot
show: Phi-4-mini's window 0 (none) and a file without LongRoPE factors (Phi-3-mini-4k).
"""

from __future__ import annotations

import numpy as np

from metrale_core.weights.gguf_arch import arch_config


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
