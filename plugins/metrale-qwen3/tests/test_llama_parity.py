"""Llama and Qwen2 logits parity with HF transformers through the paged path (fp32, <= 1e-4)."""

from __future__ import annotations

import pytest
import torch
from qwen3_harness import build_hf, load, max_logit_diff, open_store, run_mixed_schedule, save_checkpoint
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

PROMPTS = [
    [3, 9, 27, 81, 50, 6, 18],
    [70, 2, 2, 45, 13, 99, 31, 8, 77, 5, 40],
    [61, 22],
    [14, 28, 56, 19, 38, 76, 59, 24, 48],
]

CASES = {
    # GQA ratio 3, untied, llama3 rope scaling, head_dim 16 != 48 / 6.
    "llama-gqa3-llama3-rope": (
        LlamaConfig,
        LlamaForCausalLM,
        "llama",
        dict(
            vocab_size=100,
            hidden_size=48,
            intermediate_size=72,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=2,
            head_dim=16,
            rope_theta=50000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
            tie_word_embeddings=False,
        ),
    ),
    # SmolLM2-like: tied, MHA, attention and MLP biases, head_dim = hidden / heads.
    "llama-tied-biases": (
        LlamaConfig,
        LlamaForCausalLM,
        "llama",
        dict(
            vocab_size=100,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            attention_bias=True,
            mlp_bias=True,
            rope_theta=100000.0,
            tie_word_embeddings=True,
        ),
    ),
    # Qwen2: q/k/v bias (o_proj none), GQA ratio 2, linear rope scaling.
    "qwen2-qkv-bias": (
        Qwen2Config,
        Qwen2ForCausalLM,
        "qwen2",
        dict(
            vocab_size=100,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_theta=10000.0,
            rope_scaling={"rope_type": "linear", "factor": 2.0},
            tie_word_embeddings=False,
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_paged_logits_match_hf(name, tmp_path):
    config_cls, model_cls, loader, kwargs = CASES[name]
    hf = build_hf(config_cls, model_cls, seed=len(name), **kwargs)
    model = load(loader, open_store(save_checkpoint(hf, tmp_path)))
    assert model.info.architecture == loader
    runner = run_mixed_schedule(model, PROMPTS, decode_steps=8, block_size=4)
    assert all(len(runner.tokens[s]) == len(p) + 2 + 8 - (s >= 2) * 2 for s, p in enumerate(PROMPTS))
    assert max_logit_diff(hf, runner) <= 1e-4


def test_llama_has_no_qk_norm_and_qwen2_has_qkv_bias(tmp_path):
    _, _, _, kwargs = CASES["qwen2-qkv-bias"]
    hf = build_hf(Qwen2Config, Qwen2ForCausalLM, seed=1, **kwargs)
    model = load("qwen2", open_store(save_checkpoint(hf, tmp_path)))
    layer = model.weights.layers[0]
    assert layer.q_norm is None and layer.o_bias is None
    expected = torch.cat(
        [
            hf.model.layers[0].self_attn.q_proj.bias,
            hf.model.layers[0].self_attn.k_proj.bias,
            hf.model.layers[0].self_attn.v_proj.bias,
        ]
    )
    torch.testing.assert_close(layer.qkv_bias, expected.detach(), rtol=0, atol=0)
