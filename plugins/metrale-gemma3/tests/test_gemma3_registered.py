"""The plugin is installed, registered through the core's plugin loader, and its loader works."""

from __future__ import annotations

import gemma3_harness as H
import pytest

from metrale_core.api import ConfigError
from metrale_core.model_api import CausalLM
from metrale_core.plugin.components import LoadOptions
from metrale_core.plugin.discovery import load_registry
from metrale_core.testing.plugin_listing import installed_plugin
from metrale_core.weights import open_weights
from metrale_gemma3 import WEIGHT_FORMATS
from metrale_gemma3.config import Gemma3Dims


def test_plugin_is_installed_and_registered():
    reg, info = installed_plugin("gemma3", "metrale_gemma3", "metrale-gemma3")
    assert sorted(info.components["model_loaders"]) == ["gemma3"]
    for model_type in ("gemma3_text", "gemma3"):
        assert reg.find_model_loader({"model_type": model_type}).name == "gemma3"
    assert reg.find_model_loader({"model_type": "x", "architectures": ["Gemma3ForCausalLM"]}).name == "gemma3"


def test_weight_formats_are_the_shared_linear_layers():
    from metrale_core.layers import WEIGHT_FORMATS as SHARED

    assert set(WEIGHT_FORMATS) <= set(SHARED)


def test_factory_builds_a_causal_lm_with_the_layer_pattern(tmp_path):
    H.save_checkpoint("window6-softcap", tmp_path)
    store = open_weights(tmp_path)
    model = load_registry().find_model_loader(store.config).factory(store, LoadOptions(weight_format="exact"))
    assert isinstance(model, CausalLM)
    assert model.info.architecture == "gemma3" and model.info.vocab_size == H.VOCAB
    assert (model.info.kv.num_layers, model.info.kv.num_kv_heads, model.info.kv.head_dim) == (4, 2, 16)
    assert [model.dims.window(i) for i in range(4)] == [6, 6, None, 6]
    assert model.dims.attn_scale == pytest.approx(24**-0.5)
    assert model.make_state_pool(4) is None and not model.info.has_recurrent_state


def test_multimodal_config_reads_the_text_config():
    text = dict(H.CONFIGS["rope-linear"], model_type="gemma3_text")
    dims = Gemma3Dims.from_config({"model_type": "gemma3", "text_config": text, "eos_token_id": [1, 106]})
    assert dims.num_layers == 6 and dims.eos_token_ids == (1, 106)
    assert dims.layer_types == ("sliding_attention",) * 5 + ("full_attention",)
    assert dims.global_scaling == {"rope_type": "linear", "factor": 4.0} and dims.local_scaling is None
    assert (dims.global_theta, dims.local_theta) == (1_000_000.0, 10_000.0)


def test_old_style_rope_keys_are_read():
    cfg = dict(H.CONFIGS["rope-linear"])
    del cfg["rope_parameters"]
    cfg.update(rope_theta=5e5, rope_local_base_freq=2e4, rope_scaling={"rope_type": "linear", "factor": 8.0})
    dims = Gemma3Dims.from_config(cfg)
    assert (dims.global_theta, dims.local_theta) == (5e5, 2e4)
    assert dims.global_scaling == {"rope_type": "linear", "factor": 8.0}


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"hidden_activation": "relu"}, "hidden_activation"),
        ({"layer_types": ["full_attention"]}, "layer_types"),
        ({"num_key_value_heads": 3}, "GQA"),
    ],
)
def test_configs_it_cannot_run_are_config_errors(bad, match):
    with pytest.raises(ConfigError, match=match):
        Gemma3Dims.from_config(dict(H.CONFIGS["window6-softcap"], **bad))
