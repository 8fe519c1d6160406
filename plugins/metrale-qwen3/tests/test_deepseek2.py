"""DeepSeek-V2 (``deepseek2``: multi-head latent attention + DeepSeek MoE) vs transformers and
under llama.cpp's GGUF names (issue 31).

Two small random configs (fp32, ``exact``) exercise every branch the family has: q as one
projection (V2-Lite) and through its low-rank pair with its norm; softmax routing greedy and
group-limited (``n_group`` / ``topk_group``), ``routed_scaling_factor``, shared experts, dense
first layers (``first_k_dense_replace``; ``moe_layer_freq``, which transformers lacks, is read
from a config alone); DeepSeek's YaRN with ``mscale`` /
``mscale_all_dim`` (both in the RoPE tables and the softmax scale); and ``deepseek3``, the same
decoder with DeepSeek-V3's router (sigmoid scores, the correction bias -- set non-zero here --
groups ranked by their two best biased scores, renormalisation, scaling).  Each runs through the
real engine -- requests joining mid-prefill, chunked prefill, a KV pool small enough to preempt --
and every logits row is within 1e-4 of transformers' step-by-step decode, the greedy tokens equal
it and ``generate``.

A GGUF written under llama.cpp's ``deepseek2`` names and metadata (experts stacked in
``ffn_*_exps`` and Q8_0, shared experts in ``ffn_*_shexp``, the latent up-projection as
``attn_kv_b`` or as llama.cpp's newer ``attn_k_b`` / ``attn_v_b`` halves with ``head_count_kv``
1; and a DeepSeek-V3 written under the same arch, with sigmoid gating and ``exp_probs_b``) gives
the logits of transformers run on its dequantized weights: within 1e-4 under ``exact``,
within the activations' quantization under ``auto`` (experts on their Q8_0 blocks); under
``auto`` a request's logits are the same bits alone and in a batch.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as tf
from family_testlib import (
    BASE,
    PROMPTS,
    VOCAB,
    add_q8_moe_tensors,
    assert_engine_matches_hf,
    assert_stored_weights_match_hf,
    gguf_file,
    load_family,
    load_gguf,
    stored,
)
from gguf import ExpertGatingFuncType
from qwen3_harness import PagedRunner, build_hf, open_store, save_checkpoint

from metrale_core.decoder.moe_dims import MoeDims
from metrale_core.errors import ConfigError
from metrale_core.layers.formats.gguf_linear import GGUFLinear
from metrale_core.layers.lowrank.lora import LoRALinear, attach_lora
from metrale_core.layers.parallel import TensorParallel
from metrale_core.plugin.discovery import load_registry
from metrale_core.testing.gguf_names import LAYER
from metrale_qwen3.deepseek2 import DEEPSEEK2

CONFIGS = {
    # V2-Lite's shape: q in one projection, greedy top-k, one dense layer first
    "lite-no-q-lora-greedy": dict(
        hidden_size=32,
        intermediate_size=48,
        moe_intermediate_size=16,
        num_hidden_layers=3,
        num_attention_heads=4,
        kv_lora_rank=16,
        q_lora_rank=None,
        qk_nope_head_dim=8,
        qk_rope_head_dim=8,
        v_head_dim=12,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=2,
        first_k_dense_replace=1,
        routed_scaling_factor=1.5,
        tie_word_embeddings=False,
    ),
    # V2's: low-rank q, group-limited top-k, YaRN with both mscales, two dense layers
    "q-lora-grouped-yarn": dict(
        hidden_size=48,
        intermediate_size=40,
        moe_intermediate_size=24,
        num_hidden_layers=4,
        num_attention_heads=3,
        kv_lora_rank=24,
        q_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        n_routed_experts=12,
        num_experts_per_tok=3,
        n_shared_experts=1,
        n_group=4,
        topk_group=2,
        topk_method="group_limited_greedy",
        first_k_dense_replace=2,
        routed_scaling_factor=2.0,
        rope_scaling=dict(
            rope_type="yarn",
            factor=4.0,
            original_max_position_embeddings=16,
            mscale=1.0,
            mscale_all_dim=0.8,
            beta_fast=32,
            beta_slow=1,
        ),
        tie_word_embeddings=True,
    ),
}
#: Whole Q8_0 blocks and kernel tiles (llama.cpp renormalises when ``expert_weights_norm``; the
#: config keeps it off, as every V2 release, so transformers -- which ignores it -- agrees).
GGUF_CONFIG = dict(
    hidden_size=64,
    intermediate_size=64,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    kv_lora_rank=32,
    q_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=16,
    v_head_dim=32,
    n_routed_experts=16,
    num_experts_per_tok=4,
    n_shared_experts=2,
    first_k_dense_replace=1,
    routed_scaling_factor=1.5,
    norm_topk_prob=False,
    tie_word_embeddings=False,
)


#: DeepSeek-V3's router on the same decoder (``deepseek3``): sigmoid scores, the correction bias,
#: groups ranked by their two best biased scores, renormalised then scaled.
V3_CONFIG = dict(
    CONFIGS["q-lora-grouped-yarn"],
    n_routed_experts=8,
    num_experts_per_tok=3,
    n_group=4,
    topk_group=2,
    norm_topk_prob=True,
    rope_scaling=None,
    num_key_value_heads=3,  # transformers' V3 config does not default it to the head count
)
del V3_CONFIG["topk_method"]


def _hf(seed: int, config: dict, version: int = 2):
    config_cls, model_cls = (
        (tf.DeepseekV2Config, tf.DeepseekV2ForCausalLM)
        if version == 2
        else (tf.DeepseekV3Config, tf.DeepseekV3ForCausalLM)
    )
    hf = build_hf(config_cls, model_cls, seed=seed, **{**BASE, **config})
    with torch.no_grad():  # a correction bias that changes choices (transformers starts it at 0)
        for name, buffer in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(0.3 * torch.rand(buffer.shape, generator=torch.Generator().manual_seed(seed)))
    return hf


@pytest.mark.parametrize(
    ("family", "arch", "model_type"), [("deepseek2", "V2", "deepseek_v2"), ("deepseek3", "V3", "deepseek_v3")]
)
def test_the_family_is_registered(family, arch, model_type):
    reg = load_registry()
    assert {p.name: p for p in reg.plugins}["deepseek2"].error is None
    assert reg.find_model_loader({"model_type": "x", "architectures": [f"Deepseek{arch}ForCausalLM"]}).name == family
    assert reg.find_model_loader({"model_type": model_type}).name == family
    assert not reg.model_loaders[family].tensor_parallel


CASES = [("deepseek2", name, CONFIGS[name]) for name in sorted(CONFIGS)] + [("deepseek3", "v3-router", V3_CONFIG)]


@pytest.mark.parametrize(("family", "name", "config"), CASES, ids=[name for _, name, _ in CASES])
def test_engine_logits_and_greedy_match_hf(family, name, config, tmp_path):
    torch.set_num_threads(2)
    hf = _hf(len(name), config, 3 if family == "deepseek3" else 2)
    model = load_family(family, open_store(save_checkpoint(hf, tmp_path)))
    if family == "deepseek3":  # the correction bias is read, in float32
        assert model.weights.layers[-1].moe.bias is not None and model.dims.moe.group_score == "top2"
    # the cache holds the latent and the rope key: one KV head of kv_lora_rank + qk_rope_head_dim
    assert (model.info.kv.num_kv_heads, model.info.kv.head_dim) == (
        1,
        config["kv_lora_rank"] + config["qk_rope_head_dim"],
    )
    assert_engine_matches_hf(hf, model, blocks=10)


def test_the_config_sets_routing_dense_layers_and_scale(tmp_path):
    hf = _hf(1, CONFIGS["q-lora-grouped-yarn"])
    model = load_family("deepseek2", open_store(save_checkpoint(hf, tmp_path)))
    m = model.dims.moe
    assert m.sparse == (False, False, True, True)
    assert (m.groups, m.topk_groups, m.group_score, m.scale, m.shared_intermediate_size) == (4, 2, "max", 2.0, 24)
    assert [w.moe is not None for w in model.weights.layers] == [False, False, True, True]
    mscale = 0.1 * 0.8 * np.log(4.0) + 1.0
    assert model.dims.attn_scale == pytest.approx(24**-0.5 * mscale**2)
    # moe_layer_freq (DeepSeek's own rule; transformers has no such key, so only the config is
    # read here): past the dense layers, every k-th layer is sparse
    config = {**hf.config.to_dict(), "num_hidden_layers": 6, "first_k_dense_replace": 1, "moe_layer_freq": 2}
    assert MoeDims.from_config(config, DEEPSEEK2, 6).sparse == (False, False, True, False, True, False)


def test_latent_attention_refuses_tensor_parallelism_with_the_reason(tmp_path):
    store = open_store(save_checkpoint(_hf(2, CONFIGS["lite-no-q-lora-greedy"]), tmp_path))
    with pytest.raises(ConfigError, match="latent attention is not sharded"):
        load_family("deepseek2", store, tensor_parallel=TensorParallel(rank=0, world=2))


@pytest.mark.parametrize("name", ["lite-no-q-lora-greedy", "q-lora-grouped-yarn"])
def test_lora_targets_are_the_latent_projections_and_dense_mlps_by_path(name, tmp_path):
    """The definition declares an MLA layer's q (or q_a / q_b), kv_a and o_proj at their paths in
    the layer's record; kv_b (kept dense, per head) and the experts are not declared."""
    hf = _hf(1, CONFIGS[name])
    model = load_family("deepseek2", open_store(save_checkpoint(hf, tmp_path)))
    declared = {t.dotted: [p.module for p in t.parts] for t in model.lora_targets()}
    a = "model.layers.0.self_attn."
    q = {"weights.layers.0.mla.q": [a + "q_proj"]}
    if CONFIGS[name].get("q_lora_rank"):
        q = {"weights.layers.0.mla.q_a": [a + "q_a_proj"], "weights.layers.0.mla.q_b": [a + "q_b_proj"]}
    layer0 = {k: v for k, v in declared.items() if k.startswith("weights.layers.0.")}
    assert layer0 == {
        **q,
        "weights.layers.0.mla.kv_a": [a + "kv_a_proj_with_mqa"],
        "weights.layers.0.o_proj": [a + "o_proj"],
        "weights.layers.0.gate_up": ["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"],
        "weights.layers.0.down": ["model.layers.0.mlp.down_proj"],
    }
    modules = [m for ms in declared.values() for m in ms]
    assert not any(".mlp.experts." in m or ".shared_experts." in m or "kv_b" in m for m in modules)
    attach_lora(model, num_slots=1, max_rank=2, dtype=torch.float32, device="cpu")
    mla = model.weights.layers[0].mla
    assert all(isinstance(p, LoRALinear) for p in (mla.q or mla.q_b, mla.kv_a, model.weights.layers[0].o_proj))


#: HF module path (in a layer) -> llama.cpp's deepseek2 tensor name: a llama layer's, the latent
#: attention's, the router and the shared experts (experts and kv_b: below).
_GGUF = {
    **LAYER,
    "self_attn.q_a_proj": "attn_q_a",
    "self_attn.q_a_layernorm": "attn_q_a_norm",
    "self_attn.q_b_proj": "attn_q_b",
    "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
    "self_attn.kv_a_layernorm": "attn_kv_a_norm",
    "mlp.gate": "ffn_gate_inp",
    "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
    "mlp.shared_experts.up_proj": "ffn_up_shexp",
    "mlp.shared_experts.down_proj": "ffn_down_shexp",
}


#: DeepSeek-V3 as llama.cpp writes it, under the same arch: sigmoid gating, ``exp_probs_b``.
GGUF_V3_CONFIG = dict(GGUF_CONFIG, n_group=4, topk_group=2, norm_topk_prob=True, num_key_value_heads=4)


def _write_gguf(hf, path, split_kv_b: bool) -> None:
    """``hf`` as llama.cpp's converter writes a deepseek2 (``split_kv_b``: the newer files'
    ``attn_k_b`` [H, R, n] / ``attn_v_b`` [H, v, R] in F32 and ``head_count_kv`` 1, else
    ``attn_kv_b`` in Q8_0); every other matrix but the router and the token table in Q8_0, and
    ``hf``'s weights become the dequantized values (the oracle's)."""
    c = hf.config
    H, nope, rope, v, R = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.kv_lora_rank
    lengths = (1, R + rope, R) if split_kv_b else (H, nope + rope, v)
    with gguf_file(path, "deepseek2", c, VOCAB, head_lengths=lengths) as w:
        if split_kv_b:
            w.add_key_length_mla(nope + rope)
            w.add_value_length_mla(v)
        w.add_kv_lora_rank(R)
        w.add_q_lora_rank(c.q_lora_rank)
        w.add_rope_dimension_count(rope)
        w.add_leading_dense_block_count(c.first_k_dense_replace)
        w.add_expert_count(c.n_routed_experts)
        w.add_expert_used_count(c.num_experts_per_tok)
        w.add_expert_shared_count(c.n_shared_experts)
        w.add_expert_feed_forward_length(c.moe_intermediate_size)
        w.add_expert_weights_scale(c.routed_scaling_factor)
        v3 = isinstance(c, tf.DeepseekV3Config)
        w.add_expert_weights_norm(bool(c.norm_topk_prob) if v3 else False)
        w.add_expert_gating_func(ExpertGatingFuncType.SIGMOID if v3 else ExpertGatingFuncType.SOFTMAX)
        if v3:
            w.add_expert_group_count(c.n_group)
            w.add_expert_group_used_count(c.topk_group)

        def quantized(base: str, a: np.ndarray) -> bool:
            plain = a.ndim >= 2 and not base.endswith("mlp.gate") and base != "model.embed_tokens"
            return plain and not (split_kv_b and base.endswith("kv_b_proj"))

        def mla_and_bias(w, i: str, rest: str, kind: str, a: np.ndarray) -> bool:
            if kind == "e_score_correction_bias":
                w.add_tensor(f"blk.{i}.exp_probs_b.bias", **stored(a, False))
            elif rest == "self_attn.kv_b_proj" and split_kv_b:  # llama.cpp's split, k_b transposed
                k_b, v_b = np.split(a.reshape(H, nope + v, R), [nope], axis=1)
                w.add_tensor(f"blk.{i}.attn_k_b.weight", **stored(k_b.transpose(0, 2, 1), False))
                w.add_tensor(f"blk.{i}.attn_v_b.weight", **stored(v_b, False))
            elif rest == "self_attn.kv_b_proj":
                w.add_tensor(f"blk.{i}.attn_kv_b.weight", **stored(a, True))
            else:
                return False
            return True

        add_q8_moe_tensors(w, hf, _GGUF, quantized, mla_and_bias)


def _gguf_model(tmp_path, weight_format: str, split_kv_b: bool, version: int = 2):
    hf = _hf(7, GGUF_V3_CONFIG if version == 3 else GGUF_CONFIG, version)
    path = tmp_path / f"deepseek{version}-{split_kv_b}.gguf"
    return hf, load_gguf(path, lambda path: _write_gguf(hf, path, split_kv_b), "deepseek2", weight_format)


@pytest.mark.parametrize(
    ("version", "split_kv_b"), [(2, False), (2, True), (3, True)], ids=["v2-kv_b", "v2-k_b-v_b", "v3-k_b-v_b"]
)
@pytest.mark.parametrize("weight_format", ["exact", "auto"])
def test_a_gguf_under_llama_cpp_names_matches_hf(weight_format, version, split_kv_b, tmp_path):
    """V3 is written under the same arch; the metadata's sigmoid gating makes the deepseek2
    loader read ``exp_probs_b`` (transformers' V3 is the oracle, its bias non-zero)."""
    torch.set_num_threads(2)
    hf, model = _gguf_model(tmp_path, weight_format, split_kv_b, version)
    assert model.dims.moe.sparse == (False, True) and model.dims.moe.scale == 1.5
    moe = model.weights.layers[1].moe
    assert (moe.bias is not None, moe.scoring, moe.groups is not None) == (version == 3,) + (
        ("sigmoid", True) if version == 3 else ("softmax", False)
    )
    if weight_format == "auto":  # the experts stay Q8_0 blocks
        expert = model.weights.layers[1].moe.experts[0]
        assert isinstance(expert.gate_up, GGUFLinear) and isinstance(expert.down, GGUFLinear)
    assert_stored_weights_match_hf(hf, model, weight_format)


def test_a_request_gives_the_same_bits_alone_and_in_a_batch(tmp_path):
    torch.set_num_threads(2)
    _, model = _gguf_model(tmp_path, "auto", True)
    alone = PagedRunner(model, seed=1)
    batched = PagedRunner(model, seed=2)
    a, b, c = PROMPTS[1], PROMPTS[0], PROMPTS[3]
    alone.step([(0, a)])
    batched.step([(1, b), (0, a), (2, c)])
    for _ in range(3):  # decode steps, alone and beside other rows
        token = int(alone.logits[(0, len(alone.tokens[0]) - 1)].argmax())
        alone.step([(0, [token])])
        batched.step([(1, [5]), (0, [token]), (2, [7])])
    for position in range(len(alone.tokens[0])):
        assert torch.equal(alone.logits[(0, position)], batched.logits[(0, position)]), position
