"""Qwen3-MoE and Qwen2-MoE as decoder definitions, vs transformers (issue 31, item 3).

Two small random configs per family (fp32, ``exact`` weights), together exercising every branch
of the MoE block the families have: top-k with and without renormalisation (``norm_topk_prob``),
dense layers among the sparse ones (``mlp_only_layers``, ``decoder_sparse_step``), top-k equal to
the expert count, Qwen2-MoE's shared expert and its sigmoid gate, q/k/v biases, QK-norm, tied and
untied heads.  Each runs through the real engine -- requests joining mid-prefill, chunked prefill,
a KV pool small enough to preempt -- and every logits row is within 1e-4 of transformers' and the
greedy tokens equal its step-by-step decode and ``generate``'s (the dense harness's reference,
``test_dense_families``).

A GGUF written under llama.cpp's names (experts stacked in ``ffn_*_exps``, the shared expert in
``ffn_*_shexp``, every matrix but the router and the 1-D shared-expert gate in Q8_0) gives,
through the engine, the logits of transformers run on its dequantized weights: within 1e-4
under ``exact`` (the same values), within the activations' quantization under ``auto`` (the
experts multiplied on their Q8_0 blocks by the GGUF kernels).  Under ``auto`` a request's logits
are the same bits alone and in a batch.  Every weight format builds the experts (``auto`` /
``bf16`` / ``int8`` / ``int4`` near transformers); LoRA wraps no expert.
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
    assert_same_bits_alone_and_batched,
    assert_stored_weights_match_hf,
    gguf_file,
    load_family,
    load_gguf,
    stored,
)
from qwen3_harness import PagedRunner, build_hf, open_store, save_checkpoint

from metrale_core.layers.blocks import moe as moe_layer
from metrale_core.layers.formats.gguf_linear import GGUFLinear
from metrale_core.layers.lowrank.lora import attach_lora
from metrale_core.plugin.discovery import load_registry
from metrale_core.testing.gguf_names import LAYER

#: family -> (config class, model class, {config name: config}).
FAMILIES = {
    "qwen3moe": (
        tf.Qwen3MoeConfig,
        tf.Qwen3MoeForCausalLM,
        {
            "renorm-mlp-only-layer": dict(
                hidden_size=32,
                intermediate_size=64,
                moe_intermediate_size=16,
                num_hidden_layers=3,
                num_attention_heads=4,
                num_key_value_heads=2,
                num_experts=8,
                num_experts_per_tok=2,
                norm_topk_prob=True,
                mlp_only_layers=[1],
                tie_word_embeddings=False,
            ),
            "sparse-step-2-bias-tied": dict(
                hidden_size=48,
                intermediate_size=40,
                moe_intermediate_size=24,
                num_hidden_layers=4,
                num_attention_heads=4,
                num_key_value_heads=1,
                head_dim=16,
                num_experts=6,
                num_experts_per_tok=3,
                norm_topk_prob=False,
                decoder_sparse_step=2,
                attention_bias=True,
                tie_word_embeddings=True,
            ),
        },
    ),
    "qwen2moe": (
        tf.Qwen2MoeConfig,
        tf.Qwen2MoeForCausalLM,
        {
            "shared-gated-no-renorm": dict(
                hidden_size=32,
                intermediate_size=64,
                moe_intermediate_size=16,
                shared_expert_intermediate_size=24,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                num_experts=8,
                num_experts_per_tok=2,
                norm_topk_prob=False,
                tie_word_embeddings=False,
            ),
            "shared-renorm-all-experts-dense-first": dict(
                hidden_size=48,
                intermediate_size=56,
                moe_intermediate_size=16,
                shared_expert_intermediate_size=40,
                num_hidden_layers=3,
                num_attention_heads=4,
                num_key_value_heads=4,
                num_experts=4,
                num_experts_per_tok=4,
                norm_topk_prob=True,
                mlp_only_layers=[0],
                tie_word_embeddings=True,
            ),
        },
    ),
}
CASES = [(family, name) for family, (_, _, configs) in FAMILIES.items() for name in configs]
#: Per family, a config whose matrices are whole Q8_0 blocks and whole kernel tiles.
GGUF_CONFIGS = {
    "qwen3moe": dict(
        hidden_size=64,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=16,
        num_experts_per_tok=4,
        norm_topk_prob=True,  # llama.cpp always renormalises a qwen3moe's top-k
        tie_word_embeddings=False,
    ),
    "qwen2moe": dict(
        hidden_size=64,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=16,
        num_experts_per_tok=4,
        norm_topk_prob=False,  # as llama.cpp reads a qwen2moe
        tie_word_embeddings=False,
    ),
}


def _hf(family: str, seed: int, config: dict):
    config_cls, model_cls, _ = FAMILIES[family]
    return build_hf(config_cls, model_cls, seed=seed, **{**BASE, **config})


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_family_is_registered(family):
    reg = load_registry()
    assert {p.name: p for p in reg.plugins}[family].error is None
    arch = FAMILIES[family][1].__name__
    assert reg.find_model_loader({"model_type": "x", "architectures": [arch]}).name == family
    assert reg.model_loaders[family].tensor_parallel  # test_moe_tensor_parallel: TP=2 vs TP=1


@pytest.mark.parametrize(("family", "name"), CASES)
def test_engine_logits_and_greedy_match_hf(family, name, tmp_path):
    torch.set_num_threads(2)
    hf = _hf(family, len(name), FAMILIES[family][2][name])
    model = load_family(family, open_store(save_checkpoint(hf, tmp_path)))
    assert_engine_matches_hf(hf, model, blocks=10)


def test_sparse_layers_follow_the_config(tmp_path):
    configs = FAMILIES["qwen3moe"][2]
    hf = _hf("qwen3moe", 1, configs["sparse-step-2-bias-tied"])
    model = load_family("qwen3moe", open_store(save_checkpoint(hf, tmp_path / "a")))
    assert model.dims.moe.sparse == (False, True, False, True)
    assert [w.moe is not None for w in model.weights.layers] == [False, True, False, True]
    hf = _hf("qwen2moe", 1, FAMILIES["qwen2moe"][2]["shared-renorm-all-experts-dense-first"])
    model = load_family("qwen2moe", open_store(save_checkpoint(hf, tmp_path / "b")))
    m = model.dims.moe
    assert (m.sparse, m.normalize, m.shared_intermediate_size) == ((False, True, True), True, 40)


@pytest.mark.parametrize("weight_format", ["auto", "bf16", "int8", "int4"])
def test_every_weight_format_builds_the_experts(weight_format, tmp_path):
    """The experts go through the shared linear layer: each format loads and stays near HF."""
    torch.set_num_threads(2)
    hf = _hf("qwen2moe", 3, FAMILIES["qwen2moe"][2]["shared-gated-no-renorm"])
    model = load_family("qwen2moe", open_store(save_checkpoint(hf, tmp_path)), weight_format)
    runner = PagedRunner(model)
    runner.step([(0, PROMPTS[1])])
    ours = torch.stack([runner.logits[(0, p)] for p in range(len(PROMPTS[1]))])
    with torch.no_grad():
        ref = hf(torch.tensor([PROMPTS[1]])).logits[0]
    assert float((ours - ref).abs().max()) <= (1e-5 if weight_format == "auto" else 0.1)


def test_lora_wraps_attention_and_dense_mlps_but_no_expert(tmp_path):
    """An expert sees a subset of the batch's rows, which the LoRA row map does not follow: its
    projections are not LoRA targets (the dense layer's MLP and every attention are)."""
    hf = _hf("qwen3moe", 4, FAMILIES["qwen3moe"][2]["renorm-mlp-only-layer"])
    model = load_family("qwen3moe", open_store(save_checkpoint(hf, tmp_path)))
    modules = set(attach_lora(model, num_slots=2, max_rank=4, dtype=torch.float32, device="cpu"))
    assert "model.layers.0.self_attn.q_proj" in modules and "model.layers.1.mlp.gate_proj" in modules
    assert not any(".mlp.experts." in m or m.endswith("mlp.gate") for m in modules)


#: HF module path (in a layer) -> llama.cpp tensor name: a llama layer's, the router and the
#: shared expert (the experts: ``ffn_{gate,up,down}_exps``, below).
_GGUF = {
    **LAYER,
    "mlp.gate": "ffn_gate_inp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
}


def _write_gguf(arch: str, hf, path) -> None:
    """``hf`` as llama.cpp's converter writes it, every matrix but the router and the shared
    expert's gate (F32, the gate 1-D) and the token table in Q8_0; ``hf``'s weights become the
    dequantized values (the oracle's)."""
    c = hf.config
    with gguf_file(path, arch, c, VOCAB, dense_ffn=False) as w:
        w.add_expert_count(c.num_experts)
        w.add_expert_used_count(c.num_experts_per_tok)
        w.add_expert_feed_forward_length(c.moe_intermediate_size)
        if arch == "qwen2moe":
            w.add_expert_shared_feed_forward_length(c.shared_expert_intermediate_size)

        def quantized(base: str, a: np.ndarray) -> bool:
            return a.ndim >= 2 and not base.endswith(("mlp.gate", "_gate")) and base != "model.embed_tokens"

        def shared_gate(w, i: str, rest: str, kind: str, a: np.ndarray) -> bool:
            if rest == "mlp.shared_expert_gate":  # 1-D, the shape llama.cpp's loader asks for
                w.add_tensor(f"blk.{i}.ffn_gate_inp_shexp.{kind}", **stored(a[0], False))
                return True
            return False

        add_q8_moe_tensors(w, hf, _GGUF, quantized, shared_gate)


def _gguf_model(family: str, tmp_path, weight_format: str):
    hf = _hf(family, 7, GGUF_CONFIGS[family])
    return hf, load_gguf(tmp_path / f"{family}.gguf", lambda path: _write_gguf(family, hf, path), family, weight_format)


@pytest.mark.parametrize("family", sorted(GGUF_CONFIGS))
@pytest.mark.parametrize("weight_format", ["exact", "auto"])
def test_a_gguf_under_llama_cpp_names_matches_hf(family, weight_format, tmp_path):
    torch.set_num_threads(2)
    hf, model = _gguf_model(family, tmp_path, weight_format)
    if weight_format == "auto":  # the experts stay Q8_0 blocks
        expert = model.weights.layers[0].moe.experts[0]
        assert isinstance(expert.gate_up, GGUFLinear) and isinstance(expert.down, GGUFLinear)
    assert_stored_weights_match_hf(hf, model, weight_format)


@pytest.mark.parametrize("family", sorted(GGUF_CONFIGS))
def test_a_request_gives_the_same_bits_alone_and_in_a_batch(family, tmp_path):
    torch.set_num_threads(2)
    _, model = _gguf_model(family, tmp_path, "auto")
    assert_same_bits_alone_and_batched(model)


@pytest.mark.parametrize("family", sorted(GGUF_CONFIGS))
def test_experts_are_paged_in_on_first_use_only_when_routed_to(family, tmp_path, monkeypatch):
    """``auto`` on a GGUF: loading repacks no routed expert (it holds views of the mapped file and
    reads none of their pages); a prompt repacks exactly the experts its rows were routed to."""
    torch.set_num_threads(2)
    _, model = _gguf_model(family, tmp_path, "auto")
    blocks = [layer.moe for layer in model.weights.layers if layer.moe is not None]
    assert blocks

    def projections(block):
        return [p for expert in block.experts for p in (expert.gate_up, expert.down)]

    assert all(isinstance(p, GGUFLinear) and p.pending for b in blocks for p in projections(b))
    if family == "qwen2moe":  # the shared expert runs for every row: built at load
        assert not any(b.shared.gate_up.pending or b.shared.down.pending for b in blocks)
    routed: list[set[int]] = [set() for _ in blocks]
    grouped = moe_layer.grouped_experts

    def spy(x, weights, ids, experts, act):
        routed[[b.experts is experts for b in blocks].index(True)].update(ids.reshape(-1).tolist())
        return grouped(x, weights, ids, experts, act)

    monkeypatch.setattr(moe_layer, "grouped_experts", spy)
    runner = PagedRunner(model, seed=1)
    runner.step([(0, PROMPTS[0][:2])])
    runner.step([(0, [5])])
    for block, ids in zip(blocks, routed):
        assert 0 < len(ids) < len(block.experts)  # some experts were never routed to
        for e, expert in enumerate(block.experts):
            assert expert.gate_up.pending == expert.down.pending == (e not in ids), e
