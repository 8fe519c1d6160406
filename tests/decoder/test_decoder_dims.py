"""``DecoderDims.from_config``: the per-layer RoPE bases, layer types, nested text configs.

The families that use them are tested against transformers in their plugins (Gemma 3 in
``plugins/metrale-gemma3/tests``); here the readings a small config shows directly.
"""

from __future__ import annotations

import pytest

from metrale_core.decoder.spec import DecoderSpec, LayerPattern
from metrale_core.errors import ConfigError

CONFIG = dict(
    vocab_size=32,
    hidden_size=16,
    intermediate_size=24,
    num_hidden_layers=4,
    num_attention_heads=2,
    num_key_value_heads=1,
    sliding_window=8,
)
LOCAL = DecoderSpec(
    "local",
    "LocalForCausalLM",
    layers=LayerPattern(sliding_window="sliding_window", global_every=2, sliding_rope_theta="rope_local_base_freq"),
)


def test_sliding_layers_take_their_own_base_unscaled():
    config = {
        **CONFIG,
        "rope_theta": 1e6,
        "rope_local_base_freq": 2e4,
        "rope_scaling": {"rope_type": "linear", "factor": 2},
    }
    d = LOCAL.dims(config)
    assert (d.global_theta, d.global_scaling) == (1e6, {"rope_type": "linear", "factor": 2})
    assert (d.local_theta, d.local_scaling) == (2e4, None)
    assert d.layer_types == ("sliding_attention", "full_attention") * 2
    assert [d.layer_rope(i) for i in range(4)] == [1, 0, 1, 0]
    assert LOCAL.dims(CONFIG).local_theta == 10_000.0  # the key absent: transformers' default


def test_per_layer_type_rope_parameters_win_and_lose_their_theta_key():
    params = {
        "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 5e5},
        "sliding_attention": {"rope_type": "default", "rope_theta": 3e3},
    }
    d = LOCAL.dims({**CONFIG, "rope_parameters": params})
    assert (d.rope_theta, d.rope_scaling, d.local_theta, d.local_scaling) == (
        5e5,
        {"rope_type": "linear", "factor": 4.0},
        3e3,
        None,
    )


def test_a_recipe_without_a_local_base_rotates_every_layer_alike():
    spec = DecoderSpec(
        "plain", "PlainForCausalLM", layers=LayerPattern(sliding_window="sliding_window", global_every=2)
    )
    d = spec.dims({**CONFIG, "rope_local_base_freq": 2e4})
    assert d.local_theta is None and [d.layer_rope(i) for i in range(4)] == [0, 0, 0, 0]


def test_the_window_pattern_key_and_layer_types_without_a_window():
    d = LOCAL.dims({**CONFIG, "sliding_window_pattern": 4})
    assert [d.window(i) for i in range(4)] == [8, 8, 8, None]
    d = LOCAL.dims({**CONFIG, "sliding_window": None})
    assert d.windows == (None,) * 4 and d.layer_types == ("sliding_attention", "full_attention") * 2
    assert d.layer_rope(0) == 1  # a sliding layer by type keeps its base, as transformers' Gemma 3


def test_a_nested_text_config_is_read_with_the_outer_eos():
    d = LOCAL.dims({"model_type": "wrapper", "text_config": dict(CONFIG), "eos_token_id": [1, 5]})
    assert d.num_layers == 4 and d.eos_token_ids == (1, 5)
    assert LOCAL.dims({"text_config": {**CONFIG, "eos_token_id": 2}, "eos_token_id": 9}).eos_token_ids == (2,)


def test_a_bidirectional_embedding_model_is_refused():
    with pytest.raises(ConfigError, match="use_bidirectional_attention"):
        LOCAL.dims({**CONFIG, "use_bidirectional_attention": True})


def test_a_missing_max_position_is_the_family_default():
    assert LOCAL.dims(CONFIG).max_position == 4096
    spec = DecoderSpec("long", "LongForCausalLM", default_max_position=131_072)
    assert spec.dims(CONFIG).max_position == 131_072
    assert spec.dims({**CONFIG, "max_position_embeddings": 512}).max_position == 512
