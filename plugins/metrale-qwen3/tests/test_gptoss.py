"""gpt-oss as a decoder definition, vs transformers (issue 31): sinks, windows, YaRN, biased experts.

Two small random configs (fp32, ``exact`` weights), together exercising every branch the family
has: a window shorter than the prompts (alternating by default, and from ``layer_types``), sink
logits far from zero, YaRN with and without ``truncate``, more than one expert per token, the
SwiGLU clamp reached (a small ``swiglu_limit``), tied and untied heads.  Each runs through the
real engine -- requests joining mid-prefill, chunked prefill, a KV pool small enough to preempt --
and every logits row is within 1e-4 of transformers' and the greedy tokens equal its step-by-step
decode and ``generate``'s.  Over a q8_0 KV cache (heads of 32) the windowed sink layers run the
q8_0 C kernels and give the greedy tokens and logits of the codec's torch gather path.

A GGUF written under llama.cpp's gpt-oss names (``attn_sinks``, ``post_attention_norm``, the
experts de-interleaved into ``ffn_{gate,up,down}_exps`` in MXFP4 with ``[E, rows]`` biases)
gives, through the engine, the logits of transformers run on its dequantized weights: within
1e-4 under ``exact``, within the activations' quantization under ``auto`` (the experts multiplied
on their MXFP4 blocks); under ``auto`` a request's logits are the same bits alone and in a batch.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as tf
from family_testlib import (
    BASE,
    NEW_TOKENS,
    VOCAB,
    assert_engine_matches_hf,
    assert_same_bits_alone_and_batched,
    assert_stored_weights_match_hf,
    engine_rows,
    forward_reference,
    gguf_file,
    load_family,
    load_gguf,
    row_errors,
)
from gguf import GGMLQuantizationType, RopeScalingType
from gguf.quants import dequantize, quantize
from qwen3_harness import build_hf, open_store, save_checkpoint

from metrale_core.errors import ConfigError, UnknownArchitecture
from metrale_core.layers.formats.gguf_linear import GGUFLinear
from metrale_core.layers.kv_q8_codec import Q8KVCodec
from metrale_core.layers.parallel import TensorParallel
from metrale_core.plugin.discovery import load_registry
from metrale_core.testing.gguf_names import LAYER, TOP
from metrale_core.weights.gguf_hf import ARCHITECTURES

YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64)
CONFIGS = {
    "alternating-window-yarn-untied": dict(
        hidden_size=32,
        intermediate_size=16,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=4,
        rope_parameters={**YARN, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False},
        tie_word_embeddings=False,
    ),
    "layer-types-clamped-truncated-tied": dict(
        hidden_size=48,
        intermediate_size=24,
        num_hidden_layers=4,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=6,
        num_experts_per_tok=3,
        sliding_window=3,
        layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
        swiglu_limit=0.5,
        swiglu_alpha=1.5,
        rope_parameters={**YARN, "beta_fast": 8.0, "beta_slow": 2.0},
        tie_word_embeddings=True,
    ),
}


def _hf(seed: int, config: dict):
    hf = build_hf(tf.GptOssConfig, tf.GptOssForCausalLM, seed=seed, **{**BASE, **config})
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in hf.model.layers:  # sinks that matter: logits of the order of the scores
            layer.self_attn.sinks.copy_(1.5 * torch.randn(layer.self_attn.sinks.shape, generator=gen))
    return hf


def test_the_family_is_registered():
    reg = load_registry()
    assert {p.name: p for p in reg.plugins}["gptoss"].error is None
    assert reg.find_model_loader({"model_type": "x", "architectures": ["GptOssForCausalLM"]}).name == "gpt-oss"
    assert reg.find_model_loader({"model_type": "gpt-oss", "architectures": []}).name == "gpt-oss"
    assert not reg.model_loaders["gpt-oss"].tensor_parallel
    with pytest.raises(UnknownArchitecture, match="gpt-oss"):  # the list an unknown GGUF arch gets
        reg.find_model_loader({"model_type": "mamba", "architectures": []}, gguf_architectures=ARCHITECTURES)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_engine_logits_and_greedy_match_hf(name, tmp_path):
    torch.set_num_threads(2)
    hf = _hf(len(name), CONFIGS[name])
    model = load_family("gpt-oss", open_store(save_checkpoint(hf, tmp_path)))
    assert any(w is not None for w in model.dims.windows) and model.weights.layers[0].sinks.abs().max() > 0.5
    # 14 blocks of 4 tokens cannot hold the four sequences at once (a request of 28 tokens needs
    # 7 full-attention blocks and 2 of its window's): the engine preempts
    assert_engine_matches_hf(hf, model, blocks=14)


def test_windows_sinks_and_experts_follow_the_config(tmp_path):
    hf = _hf(1, CONFIGS["layer-types-clamped-truncated-tied"])
    model = load_family("gpt-oss", open_store(save_checkpoint(hf, tmp_path)))
    assert model.dims.windows == (None, 3, 3, None)
    m = model.dims.moe
    assert (m.num_experts, m.top_k, m.intermediate_size, m.swiglu_limit, m.swiglu_alpha) == (6, 3, 24, 0.5, 1.5)
    layer = model.weights.layers[2]
    assert torch.equal(layer.sinks, hf.model.layers[2].self_attn.sinks.detach())
    ref = hf.model.layers[2].mlp.experts
    gate_up = layer.moe.experts[4].gate_up  # [gate; up] rows, de-interleaved from HF's columns
    assert torch.equal(gate_up.weight[:24], ref.gate_up_proj[4, :, 0::2].T)
    assert torch.equal(gate_up.bias[24:], ref.gate_up_proj_bias[4, 1::2])


def test_a_q8_0_cache_runs_the_c_kernels_with_the_gather_paths_tokens(tmp_path, monkeypatch):
    """--kv-cache-dtype q8_0 (issue 35): every layer has sinks and every other one a window, so
    every layer attends through ``windowed_paged_attention``; it now runs the q8_0 C kernels, and
    gives the greedy tokens of the codec's torch gather (the path before; ``attends_windows``
    off) and every logits row within 1e-4 of it (the same dequantized values, summed in another
    order), with preemption and requests joining mid-prefill."""
    torch.set_num_threads(2)
    hf = _hf(5, dict(CONFIGS["alternating-window-yarn-untied"], head_dim=32))
    model = load_family("gpt-oss", open_store(save_checkpoint(hf, tmp_path)))
    library = Q8KVCodec().ops.decode.cpu_kernel
    kernels = ("dop_paged_decode_q8", "ap_paged_prefill_q8")
    calls = dict.fromkeys(kernels, 0)
    for name in kernels:
        kernel = getattr(library, name)
        monkeypatch.setattr(library, name, lambda *a, _k=kernel, _n=name: calls.update({_n: calls[_n] + 1}) or _k(*a))
    fused, fused_rows, engine = engine_rows(model, NEW_TOKENS, blocks=14, kv_cache_dtype="q8_0")
    assert isinstance(engine.kv_storage.codec, Q8KVCodec) and engine.stats().num_preemptions > 0
    assert min(calls.values()) > 0, calls
    monkeypatch.setattr(Q8KVCodec, "attends_windows", False)
    before = dict(calls)
    gathered, gathered_rows, _ = engine_rows(model, NEW_TOKENS, blocks=14, kv_cache_dtype="q8_0")
    assert calls == before  # the gather path: no q8_0 kernel ran
    assert fused == gathered
    assert [h for h, _ in fused_rows] == [h for h, _ in gathered_rows]
    worst = max((a - b).abs().max().item() for (_, a), (_, b) in zip(fused_rows, gathered_rows, strict=True))
    assert worst <= 1e-4


def test_gpt_oss_refuses_tensor_parallelism_with_the_reason(tmp_path):
    hf = _hf(2, CONFIGS["alternating-window-yarn-untied"])
    store = open_store(save_checkpoint(hf, tmp_path))
    with pytest.raises(ConfigError, match="attention sinks are not split"):
        load_family("gpt-oss", store, tensor_parallel=TensorParallel(rank=0, world=2))


#: A config whose matrices are whole Q8_0 / MXFP4 blocks and whole kernel tiles; llama.cpp's
#: layer pattern (every second layer slides, from layer 0) and YaRN (correction range truncated).
GGUF_CONFIG = dict(
    hidden_size=64,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_local_experts=8,
    num_experts_per_tok=2,
    sliding_window=4,
    rope_parameters={**YARN, "beta_fast": 16.0, "beta_slow": 2.0},
    tie_word_embeddings=False,
)
#: HF module path (in a layer) -> llama.cpp tensor name: a llama layer's attention, the sinks,
#: the post-attention norm and the router (the experts: ``ffn_{gate,up,down}_exps``, below).
_GGUF = {
    **LAYER,
    "self_attn.sinks": "attn_sinks",
    "post_attention_layernorm": "post_attention_norm",
    "mlp.router": "ffn_gate_inp",
}
Q8, MXFP4 = GGMLQuantizationType.Q8_0, GGMLQuantizationType.MXFP4


def _blocks(a: np.ndarray, qtype) -> tuple[np.ndarray, dict]:
    """``a`` through ``qtype`` and back (the oracle's values), and ``add_tensor``'s arguments."""
    a = np.ascontiguousarray(a)
    stored = quantize(a, qtype)
    return dequantize(stored, qtype).reshape(a.shape), dict(tensor=stored, raw_dtype=qtype)


def _write_gguf(hf, path) -> None:
    """``hf`` as llama.cpp's converter writes gpt-oss: attention and head in Q8_0, the experts
    de-interleaved and transposed into ``ffn_*_exps`` in MXFP4 with ``[E, rows]`` float biases,
    the router, norms, sinks and biases as float32; ``hf``'s weights become the dequantized values."""
    c = hf.config
    with gguf_file(path, "gpt-oss", c, VOCAB, dense_ffn=False) as w:
        w.add_sliding_window(c.sliding_window)
        w.add_expert_count(c.num_local_experts)
        w.add_expert_used_count(c.num_experts_per_tok)
        w.add_expert_feed_forward_length(c.intermediate_size)
        rope = c.rope_parameters
        w.add_rope_scaling_type(RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
        with torch.no_grad():
            for name, t in hf.state_dict().items():
                a = t.float().numpy()
                base, kind = name.rsplit(".", 1) if name.endswith((".weight", ".bias")) else (name, "weight")
                if base in TOP:
                    a, args = _blocks(a, Q8) if a.ndim == 2 else (a, dict(tensor=a))
                    t.copy_(torch.from_numpy(a))
                    w.add_tensor(f"{TOP[base]}.weight", **args)
                    continue
                i, rest = base.removeprefix("model.layers.").split(".", 1)
                if rest == "mlp.experts.gate_up_proj":  # [E, D, 2I], gate / up interleaved by column
                    gate, ga = _blocks(a[:, :, 0::2].transpose(0, 2, 1), MXFP4)
                    up, ua = _blocks(a[:, :, 1::2].transpose(0, 2, 1), MXFP4)
                    t[:, :, 0::2], t[:, :, 1::2] = (
                        torch.from_numpy(gate).transpose(1, 2),
                        torch.from_numpy(up).transpose(1, 2),
                    )
                    w.add_tensor(f"blk.{i}.ffn_gate_exps.weight", **ga)
                    w.add_tensor(f"blk.{i}.ffn_up_exps.weight", **ua)
                elif rest == "mlp.experts.gate_up_proj_bias":
                    w.add_tensor(f"blk.{i}.ffn_gate_exps.bias", np.ascontiguousarray(a[:, 0::2]))
                    w.add_tensor(f"blk.{i}.ffn_up_exps.bias", np.ascontiguousarray(a[:, 1::2]))
                elif rest == "mlp.experts.down_proj":  # [E, I, D]
                    down, da = _blocks(a.transpose(0, 2, 1), MXFP4)
                    t.copy_(torch.from_numpy(down).transpose(1, 2))
                    w.add_tensor(f"blk.{i}.ffn_down_exps.weight", **da)
                elif rest == "mlp.experts.down_proj_bias":
                    w.add_tensor(f"blk.{i}.ffn_down_exps.bias", a)
                elif rest.startswith("self_attn.") and rest.endswith("_proj") and kind == "weight":
                    a, args = _blocks(a, Q8)
                    t.copy_(torch.from_numpy(a))
                    w.add_tensor(f"blk.{i}.{_GGUF[rest]}.weight", **args)
                else:
                    w.add_tensor(f"blk.{i}.{_GGUF[rest]}.{kind}", a)


def _gguf_model(tmp_path, weight_format: str):
    hf = _hf(7, GGUF_CONFIG)
    return hf, load_gguf(tmp_path / "gpt-oss.gguf", lambda path: _write_gguf(hf, path), "gpt-oss", weight_format)


@pytest.mark.parametrize("weight_format", ["exact", "auto"])
def test_a_gguf_under_llama_cpp_names_with_mxfp4_experts_matches_hf(weight_format, tmp_path):
    torch.set_num_threads(2)
    hf, model = _gguf_model(tmp_path, weight_format)
    assert model.dims.windows == (4, None)
    if weight_format == "auto":  # the experts stay MXFP4 blocks, on the block kernels
        expert = model.weights.layers[0].moe.experts[0]
        assert isinstance(expert.gate_up, GGUFLinear) and isinstance(expert.down, GGUFLinear)
    assert_stored_weights_match_hf(hf, model, weight_format)


def test_a_request_gives_the_same_bits_alone_and_in_a_batch(tmp_path):
    torch.set_num_threads(2)
    _, model = _gguf_model(tmp_path, "auto")
    assert_same_bits_alone_and_batched(model)


@pytest.mark.parametrize("weight_format", ["bf16", "int8", "int4"])
def test_every_weight_format_builds_the_mxfp4_experts(weight_format, tmp_path):
    """The experts go through the shared linear layer: each format reads the MXFP4 blocks (one
    expert at a time) and stays near transformers on their values: the typical row within the
    format's rounding, the worst within a near-tied routing choice flipped by it (the router's
    own weights are rounded too)."""
    torch.set_num_threads(2)
    hf, model = _gguf_model(tmp_path, weight_format)
    assert not isinstance(model.weights.layers[1].moe.experts[7].down, GGUFLinear)
    outputs, rows, _ = engine_rows(model, 2)
    errors = sorted(row_errors(rows, *forward_reference(hf, outputs)))
    assert errors[len(errors) // 2] <= 0.05 and errors[-1] <= 0.25
