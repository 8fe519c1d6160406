"""Loading: the registered loader, config validation, the state layout, and ``met generate`` on
a checkpoint written with ``save_pretrained``."""

from __future__ import annotations

import os
import subprocess
import sys

import glm_harness as H
import pytest
import torch

from metrale_core.errors import ConfigError
from metrale_core.plugin.components import LoadOptions
from metrale_core.plugin.discovery import load_registry
from metrale_core.weights import open_weights
from metrale_glm_kda.config import GlmDims


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("glm_cli")
    H.save_checkpoint("hc2", path, seed=3, tokenizer=True)
    return path


def test_loader_is_registered_and_declares_state(checkpoint):
    store = open_weights(checkpoint)
    spec = load_registry().find_model_loader(store.config)
    assert spec.name == "glm5_next"
    model = spec.factory(store, LoadOptions())
    info = model.info
    assert info.has_recurrent_state and info.recurrent.num_layers == 2
    # 2 KDA layers x (2 heads x 8 x 8 float32 recurrent + 3 x 16 channels x 3 conv taps float32)
    assert info.recurrent.bytes_per_sequence == 2 * (2 * 8 * 8 * 4 + 3 * 16 * 3 * 4)
    assert info.kv.num_layers == 2 and info.kv.head_dim == 16 and info.kv.v_dim == 16
    pool = model.make_state_pool(3)
    assert pool.recurrent[0].shape == (3, 2, 8, 8) and pool.recurrent[0].dtype == torch.float32
    assert pool.conv[1].shape == (3, 48, 3)
    assert pool.nbytes() == 3 * info.recurrent.bytes_per_sequence


def test_lora_targets_are_every_projection_but_the_head_by_path(checkpoint):
    """The loader declares each projection it builds (KDA's seven, MLA's four, the dense and the
    shared-expert MLPs) at its path in the weights record; attach_lora wraps exactly those."""
    from metrale_core.layers.lowrank.lora import LoRALinear, attach_lora
    from metrale_core.layers.lowrank.lora_targets import resolve

    store = open_weights(checkpoint)
    model = load_registry().find_model_loader(store.config).factory(store, LoadOptions())
    declared = {t.dotted: [p.module for p in t.parts] for t in model.lora_targets()}
    d = model.dims
    for i, kind in enumerate(d.layer_types):
        a = f"weights.layers.{i}.attn."
        kda = ("qkv", "f_a", "f_b", "b_proj", "g_a", "g_b", "o_proj")
        own = kda if kind == "kda" else ("q_a", "q_b", "kv_a", "o_proj")
        assert {k for k in declared if k.startswith(a)} == {a + n for n in own}
        sparse = d.mlp_types[i] == "sparse"
        gate_up = declared[f"weights.layers.{i}.mlp.{'shared.' if sparse else ''}gate_up"]
        mlp = f"{i}.mlp.{'shared_experts.' if sparse else ''}"
        assert [m.rsplit("layers.", 1)[-1] for m in gate_up] == [mlp + "gate_proj", mlp + "up_proj"]
    assert {"mla", "kda"} <= set(d.layer_types) and "sparse" in d.mlp_types
    modules = [m for ms in declared.values() for m in ms]
    assert not any("embed_tokens" in m or "lm_head" in m or ".experts." in m for m in modules)
    targets = attach_lora(model, num_slots=1, max_rank=2, dtype=torch.float32, device="cpu")
    assert sorted(targets) == sorted(modules)
    assert all(isinstance(resolve(model, t.path), LoRALinear) for t in model.lora_targets())
    assert not isinstance(model.weights.lm_head, LoRALinear)


def test_config_refuses_shared_indexer_without_full_layer():
    cfg = H.hf_config("hc2").to_dict()
    cfg["text_config"]["indexer_types"] = ["full", "shared", "shared", "full"]
    with pytest.raises(ConfigError, match="no earlier"):
        GlmDims.from_config(cfg)
    cfg["text_config"]["indexer_types"] = ["full", "full", "shared", "full"]
    cfg["text_config"]["qk_rope_head_dim"] = 4
    with pytest.raises(ConfigError, match="NoPE"):
        GlmDims.from_config(cfg)


def test_flat_config_and_linear_attn_config_read_like_transformers():
    flat = {**H.hf_config("hc2").to_dict()["text_config"], "model_type": "glm5_next"}
    flat.pop("linear_lower_bound")
    flat["linear_attn_config"] = {"head_dim": 8, "num_heads": 2, "short_conv_kernel_size": 4}
    dims = GlmDims.from_config(flat)
    assert dims.lower_bound == -5.0 and dims.layer_types == ("kda", "mla", "mla", "kda")
    assert dims.indexer_types == ("full", "full", "shared", "full")


def test_met_generate_runs_the_checkpoint(checkpoint):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "metrale_core",
            "generate",
            "--model",
            str(checkpoint),
            "t5 t6 t7 t8 t9",
            "--max-tokens",
            "6",
            "--ignore-eos",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    words = proc.stdout.split()
    assert len(words) == 6 and all(w.startswith("t") for w in words), proc.stdout
