"""Checkpoint-scale census over real safetensors files: every spelling, partial checkpoints, bad values."""

from __future__ import annotations

import pytest
import torch
from fp8_testutil import TINY, write_checkpoint

from metrale_core.errors import WeightsError
from metrale_core.weights import open_weights
from metrale_fp8.census import SPELLINGS, kv_scale_census, load_kv_scales

#: spelling -> (K tensor suffix, V tensor suffix) under ``model.layers.N.self_attn.``
NAMES = {
    "k_scale/v_scale": ("k_scale", "v_scale"),
    "kv_scale": ("kv_scale", None),
    "k_proj.output_scale": ("k_proj.output_scale", "v_proj.output_scale"),
    "k_proj.k_scale": ("k_proj.k_scale", "v_proj.v_scale"),
    "qkv_proj.{k,v}_scale": ("qkv_proj.k_scale", "qkv_proj.v_scale"),
    "attn.{k,v}_scale": ("attn.k_scale", "attn.v_scale"),
    "{k,v}_cache.scale": ("k_cache.scale", "v_cache.scale"),
}


def scale_tensors(spelling: str, layers, k: float = 0.05, v: float = 0.02) -> dict:
    k_suffix, v_suffix = NAMES[spelling]
    out = {}
    for layer in layers:
        prefix = f"model.layers.{layer}.self_attn."
        out[prefix + k_suffix] = torch.tensor(k + layer / 100)
        if v_suffix is not None:
            out[prefix + v_suffix] = torch.tensor([v + layer / 100])
    return out


def test_every_spelling_is_in_the_table():
    assert [s for s, _, _ in SPELLINGS] == list(NAMES)


@pytest.mark.parametrize("spelling", list(NAMES))
def test_census_resolves_each_spelling(tmp_path, spelling):
    store = open_weights(write_checkpoint(tmp_path / "ckpt", scale_tensors(spelling, [0, 1])))
    census = kv_scale_census(store, num_kv_heads=2)
    assert census.num_layers == 2
    assert census.spellings() == [spelling]
    for layer in (0, 1):
        scales = census.layers[layer]
        assert scales.spelling == spelling
        assert float(scales.k_scale) == pytest.approx(0.05 + layer / 100)
        expected_v = 0.05 + layer / 100 if spelling == "kv_scale" else 0.02 + layer / 100
        assert float(scales.v_scale) == pytest.approx(expected_v)
        # the per-layer loader and the census agree: same resolver
        direct = load_kv_scales(store, layer, num_kv_heads=2)
        assert direct.names == scales.names and direct.spelling == spelling


def test_partial_checkpoint_counts_only_layers_with_scales(tmp_path):
    config = TINY | {"num_hidden_layers": 3}
    store = open_weights(write_checkpoint(tmp_path / "p", scale_tensors("k_scale/v_scale", [1]), config=config))
    census = kv_scale_census(store)
    assert sorted(census.layers) == [1]
    assert load_kv_scales(store, 0) is None and load_kv_scales(store, 2) is None


def test_mixed_spellings_are_all_reported_in_table_order(tmp_path):
    extra = scale_tensors("{k,v}_cache.scale", [0]) | scale_tensors("k_proj.k_scale", [1])
    census = kv_scale_census(open_weights(write_checkpoint(tmp_path / "m", extra)))
    assert census.spellings() == ["k_proj.k_scale", "{k,v}_cache.scale"]


def test_mtp_layer_beyond_the_count_is_counted(tmp_path):
    census = kv_scale_census(
        open_weights(write_checkpoint(tmp_path / "mtp", scale_tensors("k_scale/v_scale", [0, 1, 2])))
    )
    assert census.num_layers == 3  # layer 2 is outside num_hidden_layers=2 (an MTP head)


def test_only_k_scale_serves_both(tmp_path):
    extra = {"model.layers.0.self_attn.k_scale": torch.tensor(0.25)}
    scales = load_kv_scales(open_weights(write_checkpoint(tmp_path / "k", extra)), 0)
    assert float(scales.k_scale) == float(scales.v_scale) == 0.25


def test_per_head_scales_are_kept(tmp_path):
    extra = {
        "model.layers.0.self_attn.k_scale": torch.tensor([0.1, 0.2]),
        "model.layers.0.self_attn.v_scale": torch.tensor([0.3, 0.4]),
    }
    scales = load_kv_scales(open_weights(write_checkpoint(tmp_path / "h", extra)), 0, num_kv_heads=2)
    assert scales.k_scale.tolist() == pytest.approx([0.1, 0.2])


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_invalid_scales_are_refused_naming_the_tensor(tmp_path, bad):
    extra = {
        "model.layers.1.self_attn.v_scale": torch.tensor(bad),
        "model.layers.1.self_attn.k_scale": torch.tensor(0.1),
    }
    store = open_weights(write_checkpoint(tmp_path / "bad", extra))
    with pytest.raises(WeightsError, match=r"model\.layers\.1\.self_attn\.v_scale.*finite and > 0"):
        kv_scale_census(store)


def test_wrong_element_count_is_refused(tmp_path):
    extra = {"model.layers.0.self_attn.k_scale": torch.tensor([0.1, 0.2, 0.3])}
    store = open_weights(write_checkpoint(tmp_path / "n", extra))
    with pytest.raises(WeightsError, match="3 elements"):
        kv_scale_census(store, num_kv_heads=2)


def test_checkpoint_without_scales_has_an_empty_census(tmp_path):
    census = kv_scale_census(open_weights(write_checkpoint(tmp_path / "none")))
    assert census.num_layers == 0 and census.spellings() == []
