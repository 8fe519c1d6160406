"""The plugin is installed, registered through the core's plugin loader, and its loaders work."""

from __future__ import annotations

import pytest
from qwen3_harness import build_hf, open_store, save_checkpoint
from transformers import LlamaConfig, LlamaForCausalLM

from metrale_core.errors import ShapeMismatch
from metrale_core.model_api import CausalLM
from metrale_core.testing.plugin_listing import installed_plugin


def test_plugin_is_installed_and_registered():
    reg, info = installed_plugin("qwen3", "metrale_qwen3", "metrale-qwen3")
    assert sorted(info.components["model_loaders"]) == ["llama", "qwen2", "qwen3"]
    for name, arch in [("qwen3", "Qwen3ForCausalLM"), ("llama", "LlamaForCausalLM"), ("qwen2", "Qwen2ForCausalLM")]:
        spec = reg.model_loaders[name]
        assert spec.model_types == (name,) and spec.architectures == (arch,)
        assert reg.find_model_loader({"model_type": name}).name == name
        assert reg.find_model_loader({"model_type": "x-" + name, "architectures": [arch]}).name == name


def _tiny_llama(tmp_path, **overrides):
    kwargs = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    kwargs.update(overrides)
    return save_checkpoint(build_hf(LlamaConfig, LlamaForCausalLM, seed=0, **kwargs), tmp_path)


@pytest.mark.parametrize("store_kind", ["fake", "real"])
def test_registry_factory_builds_a_causal_lm(tmp_path, store_kind):
    from metrale_core.plugin.components import LoadOptions
    from metrale_core.plugin.discovery import load_registry

    store = open_store(_tiny_llama(tmp_path), use_real=store_kind == "real")
    spec = load_registry().find_model_loader(store.config)
    model = spec.factory(store, LoadOptions(dtype="float32"))
    assert isinstance(model, CausalLM)
    assert model.info.architecture == "llama" and model.info.vocab_size == 64
    assert (model.info.kv.num_layers, model.info.kv.num_kv_heads, model.info.kv.head_dim) == (1, 2, 8)
    assert model.make_state_pool(4) is None and not model.info.has_recurrent_state
    assert model.weights.lm_head is model.weights.embed  # tied: no lm_head.weight in the checkpoint


@pytest.mark.parametrize("store_kind", ["fake", "real"])
def test_wrong_shape_names_the_tensor(tmp_path, store_kind):
    import json

    from qwen3_harness import load

    ckpt = _tiny_llama(tmp_path)
    config = json.loads((ckpt / "config.json").read_text())
    config["intermediate_size"] = 40  # the checkpoint's MLP is 48 wide
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(ShapeMismatch, match=r"mlp.gate_proj.weight"):
        load("llama", open_store(ckpt, use_real=store_kind == "real"))


def test_loaders_declare_the_weight_formats_they_honour():
    """The registration (torch-free) declares exactly the formats ``linear`` implements."""
    from metrale_core.layers.formats.linear import WEIGHT_FORMATS
    from metrale_core.plugin.discovery import load_registry

    reg = load_registry()
    for name in ("qwen3", "llama", "qwen2"):
        assert reg.model_loaders[name].weight_formats == WEIGHT_FORMATS
