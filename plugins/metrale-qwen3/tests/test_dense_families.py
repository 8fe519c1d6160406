"""Mistral, Granite, SmolLM3, Gemma 2 and Phi-3 as decoder definitions, vs transformers (issue 31).

Two small random configs per family (fp32, ``exact`` weights), together exercising every branch
the family has: a window shorter than the prompts (Mistral, SmolLM3, Gemma 2, Phi-3), an
explicit ``head_dim`` (Mistral-Nemo), the four Granite multipliers, NoPE layers (SmolLM3),
attention and final soft-caps (Gemma 2), fused qkv / gate_up and LongRoPE past its original
length with full and partial rotary dimensions (Phi-3).  Each runs through the real engine --
requests joining mid-prefill, chunked prefill, a KV pool small enough to preempt -- and every
logits row is within 1e-4 of transformers' (its prompt forward, then one decode step at a time
over its KV cache, so LongRoPE's switch at the original length is compared step by step) and the
greedy tokens equal those steps' and ``generate``'s.  Phi-3 past its original length is compared
with the step-by-step decode only: transformers' ``generate`` (5.x) gives other logits there than
the same model stepped over its own cache (a known difference, left to be understood).
A GGUF written under llama.cpp's names (and its converter's conventions: Q/K
permuted for the llama-derived archs, Gemma's norms stored as ``1 + w``, Phi-3's fused
``attn_qkv`` / ``ffn_up`` and its LongRoPE factors as tensors) gives the same logits (the Gemma 2
one with ``query_pre_attn_scalar == head_dim``, which is what llama.cpp assumes; the Phi-3 one
past its original length, against transformers' step-by-step decode).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import transformers as tf
from family_testlib import (
    BASE,
    PROMPTS,
    VOCAB,
    add_float_tensors,
    assert_engine_matches_hf,
    assert_stored_weights_match_hf,
    engine_rows,
    gguf_file,
    load_family,
    load_gguf,
    stepwise_reference,
    worst_row,
)
from qwen3_harness import build_hf, open_store, save_checkpoint

from metrale_core.errors import ConfigError
from metrale_core.layers.parallel import TensorParallel
from metrale_core.testing.gguf_names import LAYER
from metrale_core.testing.plugin_listing import installed_plugin

#: family -> (config class, model class, {config name: config}).
FAMILIES = {
    "mistral": (
        tf.MistralConfig,
        tf.MistralForCausalLM,
        {
            "window-gqa-headdim": dict(
                hidden_size=48,
                intermediate_size=80,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=16,
                sliding_window=5,
                rope_theta=1e6,
                tie_word_embeddings=False,
            ),
            "nemo-no-window-tied": dict(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=3,
                num_attention_heads=4,
                num_key_value_heads=4,
                head_dim=12,
                sliding_window=None,
                tie_word_embeddings=True,
            ),
        },
    ),
    "granite": (
        tf.GraniteConfig,
        tf.GraniteForCausalLM,
        {
            "gqa-untied": dict(
                hidden_size=48,
                intermediate_size=80,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                embedding_multiplier=3.0,
                residual_multiplier=0.4,
                attention_multiplier=0.2,
                logits_scaling=2.5,
                tie_word_embeddings=False,
            ),
            "mha-tied-bias-linear-rope": dict(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=3,
                num_attention_heads=4,
                num_key_value_heads=4,
                attention_bias=True,
                mlp_bias=True,
                embedding_multiplier=0.5,
                residual_multiplier=1.5,
                attention_multiplier=0.1,
                logits_scaling=0.5,
                rope_scaling={"rope_type": "linear", "factor": 2.0},
                tie_word_embeddings=True,
            ),
        },
    ),
    "smollm3": (
        tf.SmolLM3Config,
        tf.SmolLM3ForCausalLM,
        {
            "nope-every-4": dict(
                hidden_size=48,
                intermediate_size=80,
                num_hidden_layers=4,
                num_attention_heads=4,
                num_key_value_heads=2,
                no_rope_layer_interval=4,
                tie_word_embeddings=False,
            ),
            "nope-sliding-tied": dict(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=3,
                num_attention_heads=4,
                num_key_value_heads=1,
                no_rope_layer_interval=3,
                use_sliding_window=True,
                sliding_window=6,
                tie_word_embeddings=True,
            ),
        },
    ),
    "gemma2": (
        tf.Gemma2Config,
        tf.Gemma2ForCausalLM,
        {
            "softcaps-window-untied": dict(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=3,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=16,
                query_pre_attn_scalar=24,
                sliding_window=5,
                attn_logit_softcapping=1.5,
                final_logit_softcapping=3.0,
                tie_word_embeddings=False,
            ),
            "final-cap-only-tied": dict(
                hidden_size=48,
                intermediate_size=80,
                num_hidden_layers=2,
                num_attention_heads=2,
                num_key_value_heads=1,
                head_dim=24,
                query_pre_attn_scalar=24,
                sliding_window=4,
                attn_logit_softcapping=None,
                final_logit_softcapping=5.0,
                tie_word_embeddings=True,
            ),
        },
    ),
    "phi3": (
        tf.Phi3Config,
        tf.Phi3ForCausalLM,
        {
            "longrope-gqa": dict(
                hidden_size=64,
                intermediate_size=80,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                original_max_position_embeddings=16,
                max_position_embeddings=64,
                rope_scaling={
                    "rope_type": "longrope",
                    "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
                    "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 9.0, 13.0, 18.0],
                },
                tie_word_embeddings=False,
            ),
            "longrope-partial-window-tied": dict(
                hidden_size=64,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=4,
                partial_rotary_factor=0.75,
                original_max_position_embeddings=12,
                max_position_embeddings=48,
                sliding_window=6,
                rope_scaling={
                    "rope_type": "longrope",
                    "short_factor": [1.0, 1.2, 1.5, 1.9, 2.4, 3.0],
                    "long_factor": [1.5, 2.0, 3.5, 5.0, 8.0, 12.0],
                },
                tie_word_embeddings=True,
            ),
        },
    ),
}
CASES = [(family, name) for family, (_, _, configs) in FAMILIES.items() for name in configs]


def _hf(family: str, name: str, seed: int):
    config_cls, model_cls, configs = FAMILIES[family]
    return build_hf(config_cls, model_cls, seed=seed, **{**BASE, **configs[name]})


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_family_is_installed_and_registered(family):
    reg, _ = installed_plugin(family, f"metrale_qwen3.{family}", "metrale-qwen3")
    spec = reg.model_loaders[family]
    arch = FAMILIES[family][1].__name__
    assert spec.model_types == (family,) and spec.architectures == (arch,)
    assert reg.find_model_loader({"model_type": "x", "architectures": [arch]}).name == family


@pytest.mark.parametrize(("family", "name"), CASES)
def test_engine_logits_and_greedy_match_hf(family, name, tmp_path):
    torch.set_num_threads(2)
    hf = _hf(family, name, seed=len(name))
    model = load_family(family, open_store(save_checkpoint(hf, tmp_path)))
    # without windows 10 blocks of 4 tokens cannot hold the four sequences at once: the engine
    # preempts; with windows the pool must let every KV group serve the longest request
    windowed = bool(model.info.kv.windows)
    # phi3: see the module docstring: generate's LongRoPE steps differ past the switch
    assert_engine_matches_hf(hf, model, 64 if windowed else 10, preempts=not windowed, generate=family != "phi3")


def test_windows_reach_the_engine_as_kv_groups(tmp_path):
    hf = _hf("gemma2", "softcaps-window-untied", seed=3)
    model = load_family("gemma2", open_store(save_checkpoint(hf, tmp_path)))
    assert model.info.kv.windows == (5, None, 5)
    assert model.dims.attn_softcap == 1.5 and model.dims.final_softcap == 3.0
    assert model.dims.attn_scale == pytest.approx(24**-0.5)


def test_nope_layers_and_multipliers_are_read_from_the_config(tmp_path):
    smol = load_family("smollm3", open_store(save_checkpoint(_hf("smollm3", "nope-every-4", seed=1), tmp_path / "s")))
    assert smol.dims.ropes == (True, True, True, False) and smol.info.kv.windows == ()
    granite = load_family("granite", open_store(save_checkpoint(_hf("granite", "gqa-untied", seed=1), tmp_path / "g")))
    d = granite.dims
    assert (d.embedding_scale, d.residual_scale, d.attn_scale, d.logits_divisor) == (3.0, 0.4, 0.2, 2.5)


def test_phi3_refuses_tensor_parallelism_with_the_reason(tmp_path):
    store = open_store(save_checkpoint(_hf("phi3", "longrope-gqa", seed=2), tmp_path))
    with pytest.raises(ConfigError, match="fused qkv_proj / gate_up_proj"):
        load_family("phi3", store, tensor_parallel=TensorParallel(rank=0, world=2))


#: HF module path -> llama.cpp tensor name: a llama layer's, and Phi-3's fused tensors (stored as
#: they are); the norms after the attention per arch, below.
_GGUF = {**LAYER, "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"}
#: Per GGUF arch: the HF family, its norm names, Q/K permuted by the converter, norms stored as 1 + w.
_ARCHS = {
    "llama": ("mistral", {"post_attention_layernorm": "ffn_norm"}, True, False),
    "granite": ("granite", {"post_attention_layernorm": "ffn_norm"}, True, False),
    "smollm3": ("smollm3", {"post_attention_layernorm": "ffn_norm"}, True, False),
    "gemma2": (
        "gemma2",
        {
            "post_attention_layernorm": "post_attention_norm",
            "pre_feedforward_layernorm": "ffn_norm",
            "post_feedforward_layernorm": "post_ffw_norm",
        },
        False,
        True,
    ),
    "phi3": ("phi3", {"post_attention_layernorm": "ffn_norm"}, False, False),
}


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute`` of Q/K rows."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_gguf(arch: str, hf, path) -> None:
    _, norms, permuted, offset = _ARCHS[arch]
    c = hf.config
    with gguf_file(path, arch, c, VOCAB) as w:
        if arch == "granite":
            w.add_embedding_scale(c.embedding_multiplier)
            w.add_residual_scale(c.residual_multiplier)
            w.add_attention_scale(c.attention_multiplier)
            w.add_logit_scale(c.logits_scaling)
        if arch == "gemma2":
            w.add_sliding_window(c.sliding_window)
            if c.attn_logit_softcapping is not None:
                w.add_attn_logit_softcapping(c.attn_logit_softcapping)
            w.add_final_logit_softcapping(c.final_logit_softcapping)
        if arch == "phi3":  # llama.cpp's Phi3MiniModel: no rope.scaling.type, the factors as tensors
            rope = c.rope_parameters
            original = rope["original_max_position_embeddings"]
            w.add_rope_scaling_orig_ctx_len(original)
            w.add_rope_dimension_count(
                int(getattr(c, "partial_rotary_factor", 1.0) * c.hidden_size) // c.num_attention_heads
            )
            w.add_sliding_window(c.sliding_window or 0)
            scale = c.max_position_embeddings / original
            w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)
            w.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
            w.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))

        def converted(module: str, name: str, a: np.ndarray) -> np.ndarray:
            if permuted and module in ("self_attn.q_proj", "self_attn.k_proj"):
                a = _permute(a, c.num_attention_heads if module == "self_attn.q_proj" else c.num_key_value_heads)
            return a + 1.0 if offset and name.endswith("norm.weight") else a

        add_float_tensors(w, hf, {**_GGUF, **norms}, converted)


@pytest.mark.parametrize(
    ("arch", "name"),
    [
        ("llama", "nemo-no-window-tied"),
        ("granite", "gqa-untied"),
        ("smollm3", "nope-every-4"),
        ("gemma2", "final-cap-only-tied"),
        ("phi3", "longrope-partial-window-tied"),
    ],
)
def test_a_gguf_under_llama_cpp_names_matches_hf(arch, name, tmp_path):
    torch.set_num_threads(2)
    family = _ARCHS[arch][0]
    hf = _hf(family, name, seed=11)
    path = tmp_path / f"{arch}.gguf"
    model = load_gguf(path, lambda p: _write_gguf(arch, hf, p), "llama" if arch == "llama" else family, arch=arch)
    if arch != "phi3":
        assert_stored_weights_match_hf(hf, model, "exact")
        return
    # past LongRoPE's original length: transformers stepped over its cache
    outputs, rows, _ = engine_rows(model, 4)
    steps = [stepwise_reference(hf, p) for p in PROMPTS]
    assert outputs == [tokens[:4] for tokens, _ in steps]
    full = [p + o for p, o in zip(PROMPTS, outputs)]
    assert worst_row(rows, full, [reference for _, reference in steps]) <= 1e-4
