"""GGUF files written like llama.cpp's converter read back in HF names and layout."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from weights_testutil import gguf_name, hf_to_gguf, llama_permute, tiny_hf_model

from metrale_core.weights import GGUFStore, dequantize, open_weights
from metrale_core.weights.gguf_hf import hf_name, unpermute_rows

Q = gguf.GGMLQuantizationType
_MIXED = {
    "q_proj": Q.Q4_1,
    "k_proj": Q.Q4_0,
    "v_proj": Q.Q8_0,
    "o_proj": Q.BF16,
    "gate_proj": Q.F16,
    "up_proj": Q.Q4_1,
    "down_proj": Q.Q8_0,
    "embed_tokens": Q.Q8_0,
    "lm_head": Q.Q4_0,
}
_TOL = {Q.F32: 0.0, Q.F16: 1e-3, Q.BF16: 8e-3, Q.Q8_0: 1e-2, Q.Q4_0: 0.16, Q.Q4_1: 0.08}


def _all_f32(name: str, value: np.ndarray) -> Q:
    return Q.F32


def _mixed(name: str, value: np.ndarray) -> Q:
    if value.ndim == 1:
        return Q.F32
    return next(q for key, q in _MIXED.items() if f"{key}." in name)


def _write(tmp_path: Path, arch: str, qtypes=_all_f32, *, tie: bool, bias: bool = False, extra=None):
    model, hp = tiny_hf_model(arch, tie=tie, bias=bias)
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    path = tmp_path / f"{arch}.gguf"
    written = hf_to_gguf(path, arch, hp, state, qtypes, extra)
    return path, state, written, hp


@pytest.mark.parametrize(
    "arch,tie,bias", [("llama", False, True), ("llama", True, False), ("qwen3", True, False), ("qwen2", False, True)]
)
def test_f32_round_trip_is_exact(tmp_path: Path, arch: str, tie: bool, bias: bool) -> None:
    path, state, _, hp = _write(tmp_path, arch, tie=tie, bias=bias)
    store = open_weights(path)
    assert isinstance(store, GGUFStore) and store.format == "gguf" and store.path == path
    expected = set(state) - ({"lm_head.weight"} if tie else set())
    assert set(store.names()) == expected and ("lm_head.weight" in store) is not tie
    for name in store.names():  # q/k (weights and llama biases) come back un-permuted, bit for bit
        assert torch.equal(store.get(name), torch.from_numpy(state[name])), name
    cfg = store.config
    arch_class = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[arch]
    assert cfg["model_type"] == arch and cfg["architectures"] == [arch_class]
    for key in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "rope_theta",
        "rms_norm_eps",
    ):
        assert cfg[key] == hp[key], key
    assert cfg["tie_word_embeddings"] is tie and cfg["attention_bias"] is bias
    assert cfg["mlp_bias"] is (bias and arch == "llama")  # ffn_*.bias: only the llama case has them
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (1, 2)
    assert cfg["rope_parameters"] == {"rope_type": "default", "rope_theta": hp["rope_theta"]}


def test_llama_permutation_really_happens_on_disk(tmp_path: Path) -> None:
    path, state, written, _ = _write(tmp_path, "llama", tie=False)
    q = state["model.layers.0.self_attn.q_proj.weight"]
    on_disk = written["blk.0.attn_q.weight"]
    assert not np.array_equal(on_disk, q)  # the converter permuted it ...
    np.testing.assert_array_equal(unpermute_rows(on_disk, 4), q)  # ... and we undo exactly that
    np.testing.assert_array_equal(unpermute_rows(llama_permute(q, 4, 2), 2), q)  # k-style: kv heads
    np.testing.assert_array_equal(open_weights(path).get_raw("model.layers.0.self_attn.q_proj.weight").data, q)


def test_mixed_quant_types(tmp_path: Path) -> None:
    path, state, written, _hp = _write(tmp_path, "llama", _mixed, tie=False)
    store = open_weights(path)
    store_names = {v: k for k, v in store.gguf_names.items()}
    for gname, data in written.items():
        name = store_names[gname]
        qtype = Q[store.quant_type(name)]
        got = store.get(name).numpy()
        ref = gguf.quants.dequantize(data, qtype).astype(np.float32).reshape(state[name].shape)
        if ".q_proj." in name or ".k_proj." in name:
            ref = unpermute_rows(ref, 4 if ".q_proj." in name else 2)
        np.testing.assert_array_equal(got, ref, err_msg=name)
        err = np.abs(got - state[name]).max() / np.abs(state[name]).max()
        assert err <= _TOL[qtype], (name, qtype.name, err)
        raw = store.get_raw(name)  # raw rows are in HF order too: dequantizing them gives get()
        assert raw.quant_type == qtype.name and raw.shape == state[name].shape
        np.testing.assert_array_equal(dequantize(raw.data, raw.quant_type, raw.shape), got, err_msg=name)
    assert store.quant_type("model.layers.1.self_attn.q_proj.weight") == "Q4_1"
    assert store.quant_type("lm_head.weight") == "Q4_0"
    assert store.get("model.embed_tokens.weight", dtype=torch.float16).dtype == torch.float16


def test_matches_transformers_own_gguf_loader(tmp_path: Path) -> None:
    """An independent check of names + Q/K un-permutation: HF transformers reads the same file."""
    import transformers

    path, _, _, _ = _write(tmp_path, "llama", _mixed, tie=False)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32)
    hf_state = hf.state_dict()
    store = open_weights(path)
    for name in store.names():
        assert torch.equal(store.get(name), hf_state[name]), name


def test_metadata_names_and_directory_open(tmp_path: Path) -> None:
    def extra(w: gguf.GGUFWriter) -> None:
        w.add_string("general.name", "tiny ünïcode")
        w.add_array("test.floats", [0.5, 1.5])
        w.add_float32("test.eps", 1e-5)

    path, _, _, _ = _write(tmp_path, "qwen3", tie=True, extra=extra)
    store = open_weights(tmp_path)  # a directory holding exactly one .gguf file
    assert store.path == path
    md = store.gguf_metadata
    assert md["general.architecture"] == "qwen3" and md["general.name"] == "tiny ünïcode"
    assert md["test.floats"] == [0.5, 1.5] and md["test.eps"] == 1e-5
    assert md["tokenizer.ggml.tokens"][:3] == ["t0", "t1", "t2"] and len(md["tokenizer.ggml.tokens"]) == 96
    assert "GGUF.tensor_count" not in md
    assert store.gguf_names["model.layers.1.self_attn.k_norm.weight"] == "blk.1.attn_k_norm.weight"
    assert store.tokenizer_dir is None


def test_name_mapping_table() -> None:
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("output.weight") == "lm_head.weight" and hf_name("output_norm.weight") == "model.norm.weight"
    assert hf_name("blk.12.attn_output.weight") == "model.layers.12.self_attn.o_proj.weight"
    assert hf_name("blk.0.attn_v.bias") == "model.layers.0.self_attn.v_proj.bias"
    assert hf_name("blk.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight"
    assert hf_name("rope_freqs.weight") is None and hf_name("blk.x.attn_q.weight") is None
    for hf in ("model.layers.7.mlp.gate_proj.weight", "model.layers.0.self_attn.q_norm.weight", "lm_head.weight"):
        assert hf_name(gguf_name(hf)) == hf


def test_unknown_gguf_names_pass_through(tmp_path: Path) -> None:
    def extra(w: gguf.GGUFWriter) -> None:
        w.add_tensor("rope_freqs.weight", np.linspace(1, 2, 8, dtype=np.float32))

    path, _, _, _ = _write(tmp_path, "llama", tie=True, extra=extra)
    store = open_weights(path)
    assert "rope_freqs.weight" in store
    np.testing.assert_array_equal(store.get("rope_freqs.weight").numpy(), np.linspace(1, 2, 8, dtype=np.float32))


@pytest.mark.slow
def test_real_smollm2_file(real_gguf: Path) -> None:
    store = open_weights(real_gguf)
    cfg = store.config
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"]) == (30, 576, 1536)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (9, 3, 64)
    assert cfg["rope_theta"] == 100000.0 and cfg["rms_norm_eps"] == 1e-5 and cfg["max_position_embeddings"] == 8192
    assert cfg["tie_word_embeddings"] is True and cfg["vocab_size"] == 49152
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["architectures"]) == (1, 2, ["LlamaForCausalLM"])
    assert len(store) == 272 and "lm_head.weight" not in store
    assert sum(store.quant_type(n) == "Q4_1" for n in store) == 210
    assert sum(store.quant_type(n) == "F32" for n in store) == 61
    assert store.quant_type("model.embed_tokens.weight") == "Q8_0"
    assert store.shape("model.embed_tokens.weight") == (49152, 576)
    assert store.shape("model.layers.0.self_attn.k_proj.weight") == (192, 576)
    assert store.gguf_metadata["tokenizer.ggml.pre"] == "smollm"
    # our Q4_1 / Q8_0 decode equals gguf's own; q_proj additionally un-permuted with 9 heads
    reader = gguf.GGUFReader(real_gguf)
    raw = {t.name: t for t in reader.tensors}
    for gname, name, heads in (
        ("blk.5.attn_q.weight", "model.layers.5.self_attn.q_proj.weight", 9),
        ("blk.5.attn_k.weight", "model.layers.5.self_attn.k_proj.weight", 3),
        ("blk.5.ffn_down.weight", "model.layers.5.mlp.down_proj.weight", None),
        ("token_embd.weight", "model.embed_tokens.weight", None),
    ):
        t = raw[gname]
        ref = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        if heads is not None:
            ref = unpermute_rows(ref, heads)
        np.testing.assert_array_equal(store.get(name).numpy(), ref, err_msg=name)
