"""HF checkpoint directories written by transformers read back tensor-for-tensor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from weights_testutil import tiny_hf_model

from metrale_core.errors import ShapeMismatch
from metrale_core.weights import SafetensorsStore, WeightStore, normalise_config, open_weights


def _saved(tmp_path: Path, arch: str, *, tie: bool, **save_kwargs) -> tuple[Path, dict[str, torch.Tensor]]:
    model, _ = tiny_hf_model(arch, tie=tie)
    model.save_pretrained(tmp_path, **save_kwargs)
    return tmp_path, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_single_file_qwen3_round_trip(tmp_path: Path) -> None:
    directory, state = _saved(tmp_path, "qwen3", tie=True)
    store = open_weights(directory)
    assert isinstance(store, SafetensorsStore) and isinstance(store, WeightStore)
    assert store.format == "safetensors" and store.path == directory
    assert (directory / "model.safetensors").is_file()
    # tied: transformers' state_dict lists lm_head, the file does not
    assert set(store.names()) == set(state) - {"lm_head.weight"}
    assert "lm_head.weight" not in store and "model.norm.weight" in store and len(store) == len(state) - 1
    for name in store.names():
        got = store.get(name)
        assert got.dtype == torch.float32 and got.is_contiguous()
        assert torch.equal(got, state[name]), name
        assert store.quant_type(name) == "F32"
        assert store.shape(name) == tuple(state[name].shape)
    cfg = store.config
    assert cfg["model_type"] == "qwen3" and cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["head_dim"], cfg["vocab_size"]) == (64, 2, 32, 96)
    assert cfg["tie_word_embeddings"] is True
    assert cfg["rope_theta"] == 5000.0  # transformers 5 writes only rope_parameters; the store adds rope_theta
    assert store.gguf_metadata is None


def test_sharded_llama_round_trip(tmp_path: Path) -> None:
    directory, state = _saved(tmp_path, "llama", tie=False, max_shard_size="40KB")
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 3  # really sharded
    store = open_weights(directory)
    assert set(store.names()) == set(state)
    assert "lm_head.weight" in store and store.config["tie_word_embeddings"] is False
    for name in store.names():
        assert torch.equal(store.get(name), state[name]), name
    assert store.config["num_key_value_heads"] == 2 and store.config["rms_norm_eps"] == 1e-5
    # every raw tensor names its own shard file (the repack cache keys derived records by it)
    for name, shard in index["weight_map"].items():
        file = (directory / shard).resolve()
        source = store.get_raw(name).source
        assert source is not None and (source.path, source.size) == (str(file), file.stat().st_size)
        assert source.mtime_ns == file.stat().st_mtime_ns and source.name == name
        assert source.shape == tuple(state[name].shape)


def test_dtypes_fresh_tensors_and_raw(tmp_path: Path) -> None:
    model, _ = tiny_hf_model("qwen3", tie=True)
    model.to(torch.bfloat16).save_pretrained(tmp_path)
    store = open_weights(tmp_path)
    name = "model.layers.1.self_attn.q_proj.weight"
    expected = model.state_dict()[name]
    assert store.quant_type(name) == "BF16"
    assert torch.equal(store.get(name), expected.float())
    assert store.get(name, dtype=torch.bfloat16).dtype == torch.bfloat16
    raw = store.get_raw(name)
    assert raw.quant_type == "BF16" and raw.shape == (128, 64) and raw.data.dtype == torch.bfloat16
    assert torch.equal(raw.data, expected)
    # a returned tensor is the caller's own: writing into it changes nothing for the next caller
    for dtype in (torch.bfloat16, torch.float32):
        first = store.get(name, dtype=dtype, shape=(128, 64))
        first.fill_(7.0)
        assert torch.equal(store.get(name, dtype=dtype), expected.to(dtype))


def test_shape_check(tmp_path: Path) -> None:
    directory, _ = _saved(tmp_path, "qwen3", tie=True)
    store = open_weights(directory)
    assert store.get("model.norm.weight", shape=[64]).shape == (64,)
    with pytest.raises(ShapeMismatch, match=r"'model.norm.weight'.*\[64\].*\[65\]"):
        store.get("model.norm.weight", shape=(65,))


def test_tokenizer_dir(tmp_path: Path) -> None:
    directory, _ = _saved(tmp_path, "qwen3", tie=True)
    assert open_weights(directory).tokenizer_dir is None
    (directory / "tokenizer.json").write_text("{}")
    assert open_weights(directory).tokenizer_dir == directory


def test_close_and_context_manager(tmp_path: Path) -> None:
    directory, _ = _saved(tmp_path, "qwen3", tie=True)
    with open_weights(directory) as store:
        assert store.get("model.norm.weight").shape == (64,)
    with pytest.raises(Exception, match="closed"):
        store.get("model.norm.weight")


def test_normalise_config_derives_keys() -> None:
    cfg = normalise_config({"hidden_size": 64, "num_attention_heads": 4, "rope_theta": 1e6})
    assert cfg["head_dim"] == 16 and cfg["num_key_value_heads"] == 4
    assert cfg["rope_parameters"] == {"rope_type": "default", "rope_theta": 1e6}
    cfg = normalise_config(
        {
            "rope_theta": 1e4,
            "rope_scaling": {"type": "linear", "factor": 2.0},
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 8,
        }
    )
    assert cfg["rope_parameters"] == {"type": "linear", "factor": 2.0, "rope_type": "linear", "rope_theta": 1e4}
    assert cfg["num_key_value_heads"] == 1 and cfg["head_dim"] == 8
    cfg = normalise_config({"rope_parameters": {"rope_type": "default", "rope_theta": 3.0}})
    assert cfg["rope_theta"] == 3.0
