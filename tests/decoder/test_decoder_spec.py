"""The decoder definition (``metrale_core.decoder.spec``): defaults, registration, refusals.

The families built on it are tested against transformers in their plugins
(``plugins/metrale-qwen3/tests``: Llama, Qwen2, Qwen3 and OLMo 2).
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from metrale_core.decoder.spec import ROPE_KINDS, ROPE_KINDS_BUILT, WEIGHT_FORMATS, Attention, DecoderSpec, Mlp, Norms
from metrale_core.errors import ConfigError
from metrale_core.layers.parallel import TensorParallel
from metrale_core.plugin.components import LoadOptions

#: A tiny Llama config: the definition reads it before any tensor.
CONFIG = dict(
    vocab_size=32,
    hidden_size=16,
    intermediate_size=24,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
)


def test_the_weight_formats_are_the_linear_layers():
    from metrale_core.layers.formats.linear import WEIGHT_FORMATS as LINEAR_FORMATS

    assert WEIGHT_FORMATS == LINEAR_FORMATS


def test_importing_the_definition_imports_no_torch():
    code = "import sys, metrale_core.decoder; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_defaults_are_llama_and_the_loader_spec_follows_the_definition():
    spec = DecoderSpec("mini", "MiniForCausalLM", "a test family")
    assert spec.model_types == ("mini",) and spec.architectures == ("MiniForCausalLM",)
    assert spec.unbuilt() == [] and spec.tensor_parallel_note == ""
    assert spec.norms == Norms(pre_attn=True, post_attn=False, pre_mlp=True, post_mlp=False)
    loader = spec.loader_spec()
    assert (loader.name, loader.model_types, loader.architectures) == ("mini", ("mini",), ("MiniForCausalLM",))
    assert loader.weight_formats == WEIGHT_FORMATS and loader.tensor_parallel
    assert loader.factory == spec.load


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        (dict(attention=Attention(kind="mla", fused_qkv=True)), "attention.fused_qkv with attention.kind='mla'"),
        (dict(attention=Attention(kind="mla", sinks=True)), "attention.sinks with attention.kind='mla'"),
        (dict(mlp=Mlp(shared_experts=True)), "mlp.shared_experts without mlp.kind='moe'"),
    ],
)
def test_what_is_declared_but_not_built_is_refused_at_load_by_name(changes, named):
    spec = DecoderSpec("future", "FutureForCausalLM", **changes)
    assert spec.unbuilt()
    with pytest.raises(
        ConfigError, match=f"future: the definition declares .*{named.replace('(', '.')}.*not built yet"
    ):
        spec.load(SimpleNamespace(config=CONFIG), LoadOptions())


def test_every_declared_rope_kind_is_built_and_another_is_refused_by_name():
    assert ROPE_KINDS_BUILT == ROPE_KINDS
    spec = DecoderSpec("mini", "MiniForCausalLM")
    config = {**CONFIG, "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}
    with pytest.raises(ConfigError, match="rope type 'dynamic' is not built"):
        spec.load(SimpleNamespace(config=config), LoadOptions())


def test_an_unshardable_recipe_refuses_tensor_parallelism_before_reading():
    spec = DecoderSpec("proj", "ProjForCausalLM", attention=Attention(qk_norm="proj"))
    assert not spec.loader_spec().tensor_parallel
    options = LoadOptions(tensor_parallel=TensorParallel(rank=0, world=2))
    with pytest.raises(ConfigError, match="proj: the QK-norm over the whole projection"):
        spec.load(SimpleNamespace(config=CONFIG), options)


def test_another_activation_is_refused():
    with pytest.raises(ConfigError, match=r"hidden_act 'gelu' is not supported by the mini loader \(only silu\)"):
        DecoderSpec("mini", "M").load(SimpleNamespace(config={**CONFIG, "hidden_act": "gelu"}), LoadOptions())
