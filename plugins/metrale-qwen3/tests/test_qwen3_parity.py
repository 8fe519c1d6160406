"""Qwen3 logits parity with HF transformers through the paged path (fp32, max |diff| <= 1e-4)."""

from __future__ import annotations

import pytest
import torch
from qwen3_harness import build_hf, load, max_logit_diff, open_store, run_mixed_schedule, save_checkpoint
from transformers import Qwen3Config, Qwen3ForCausalLM

CONFIGS = {
    # GQA ratio 1, tied head, head_dim 16 != 48 / 4.
    "mha-tied": dict(
        vocab_size=96,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=16,
        rope_theta=1e6,
        tie_word_embeddings=True,
    ),
    # GQA ratio 4, untied head, attention bias, head_dim 8 != 32 / 8.
    "gqa4-untied-bias": dict(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=8,
        attention_bias=True,
        tie_word_embeddings=False,
    ),
    # GQA ratio 4 with one KV head, tied, head_dim 32 != 64 / 4, three layers.
    "gqa4-one-kv-head": dict(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
}

PROMPTS = [
    [5, 17, 3, 88, 41, 9, 60],
    [2, 70, 33, 14, 95, 7, 50, 21, 11, 64, 3, 8, 19],
    [44, 1, 90],
    [12, 12, 80, 6, 37, 58, 29, 71, 4, 66],
]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_qwen3_paged_logits_match_hf(name, tmp_path):
    torch.set_num_threads(2)
    hf = build_hf(Qwen3Config, Qwen3ForCausalLM, seed=len(name), **CONFIGS[name])
    model = load("qwen3", open_store(save_checkpoint(hf, tmp_path)))
    assert model.info.kv.num_kv_heads == CONFIGS[name]["num_key_value_heads"]
    assert model.info.kv.head_dim == CONFIGS[name]["head_dim"]
    runner = run_mixed_schedule(model, PROMPTS, decode_steps=8, block_size=4)
    # prompts + 2 decode rows mixed into each of 2 prefill steps + 8 pure-decode steps of 4
    assert len(runner.logits) == sum(map(len, PROMPTS)) + 2 * 2 + 4 * 8
    assert max_logit_diff(hf, runner) <= 1e-4


def test_qwen3_block_size_does_not_change_logits(tmp_path):
    hf = build_hf(Qwen3Config, Qwen3ForCausalLM, seed=3, **CONFIGS["gqa4-untied-bias"])
    model = load("qwen3", open_store(save_checkpoint(hf, tmp_path)))
    small = run_mixed_schedule(model, PROMPTS, decode_steps=3, block_size=2)
    large = run_mixed_schedule(model, PROMPTS, decode_steps=3, block_size=16)
    assert small.logits.keys() == large.logits.keys()
    diff = max(float((small.logits[k] - large.logits[k]).abs().max()) for k in small.logits)
    assert diff <= 1e-5


def test_qwen3_bfloat16_tracks_float32(tmp_path):
    hf = build_hf(Qwen3Config, Qwen3ForCausalLM, seed=5, **CONFIGS["mha-tied"])
    store = open_store(save_checkpoint(hf, tmp_path))
    ref = run_mixed_schedule(load("qwen3", store), PROMPTS[:2], decode_steps=2)
    bf16 = load("qwen3", store, dtype="bfloat16")
    assert bf16.info.dtype == torch.bfloat16 and bf16.info.kv.dtype == torch.bfloat16
    assert bf16.weights.embed.dtype == torch.bfloat16
    # Feed the same tokens the fp32 run chose, so both runs see identical inputs.
    runner = run_mixed_schedule(bf16, PROMPTS[:2], decode_steps=0)
    for seq, toks in ref.tokens.items():
        extra = toks[len(runner.tokens[seq]) :]
        for tok in extra:
            runner.step([(seq, [tok])])
    scale = max(float(v.abs().max()) for v in ref.logits.values())
    worst = max(float((runner.logits[k] - ref.logits[k]).abs().max()) for k in ref.logits)
    assert worst <= 0.05 * scale
