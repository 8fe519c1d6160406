"""Qwen3 and Llama through the real engine path vs HF transformers.

Paged KV (block size 4), chunked prefill (12 tokens a step), a batch of 4 sequences of different
lengths, two of them sharing a 16-token prefix through the prefix cache, then 32 batched decode
steps. Every logits row the engine computes is compared with HF run on the exact token history
the model attended to (max abs diff <= 1e-4, fp32), and the greedy tokens with HF ``generate``.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.plugin.components import LoadOptions
from metrale_core.plugin.discovery import load_registry
from metrale_core.sampling.params import SamplingParams
from metrale_core.testing.forward_spy import ForwardSpy
from metrale_core.testing.hf_parity import worst_row_diff
from metrale_core.testing.staggered import run_joining_mid_prefill
from metrale_core.weights import open_weights

VOCAB = 160
NEW_TOKENS = 32


def _model(arch, kv_heads, tie, **extra):
    """``({arch}ForCausalLM, its config)``: 2 layers, 4 query heads over ``kv_heads``."""
    config = getattr(transformers, f"{arch}Config")(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        tie_word_embeddings=tie,
        max_position_embeddings=256,
        rope_theta=10000.0,
        **extra,
    )
    return getattr(transformers, f"{arch}ForCausalLM"), config


def _qwen3(kv_heads, tie, head_dim):
    return _model("Qwen3", kv_heads, tie, head_dim=head_dim, rms_norm_eps=1e-6)


def _llama(kv_heads, tie):
    return _model("Llama", kv_heads, tie, rms_norm_eps=1e-5)


CASES = {
    "qwen3-gqa1-untied-hd32": lambda: _qwen3(4, False, 32),
    "qwen3-gqa4-tied-hd32": lambda: _qwen3(1, True, 32),
    "qwen3-gqa2-tied-hd16": lambda: _qwen3(2, True, 16),
    "llama-gqa4-tied": lambda: _llama(1, True),
    "llama-gqa1-untied": lambda: _llama(4, False),
}


def save_checkpoint(model_cls, config, path, seed=0):
    """Random-init an HF model, save it as safetensors and return it (eval, fp32)."""
    torch.manual_seed(seed)
    hf = model_cls(config).eval()
    hf.save_pretrained(path, safe_serialization=True)
    return hf


def _prompts(seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(3, VOCAB, (n,), generator=g).tolist()
    first = rand(21)
    return [first, first[:16] + rand(6), rand(7), rand(30)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_engine_logits_and_greedy_match_hf(case, tmp_path):
    model_cls, config = CASES[case]()
    hf = save_checkpoint(model_cls, config, tmp_path)
    store = open_weights(tmp_path)
    registry = load_registry()
    spec = registry.find_model_loader(store.config)
    spy = ForwardSpy(spec.factory(store, LoadOptions()))
    engine = LLMEngine(
        spy,
        EngineConfig(block_size=4, num_kv_blocks=96, max_prefill_tokens=12, enable_prefix_caching=True),
        registry=registry,
    )
    prompts = _prompts(seed=len(case))
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    # r0's 21-token prompt prefills in two chunks of 12 and 9 before the others join
    outputs = run_joining_mid_prefill(engine, prompts, params, lead_steps=2)

    stats = engine.scheduler.block_manager.prefix_cache_stats()
    assert stats.hits >= 16, f"r1 should reuse r0's 4 full prefix blocks, got {stats}"

    assert len(spy.rows) >= 4 * NEW_TOKENS
    with torch.no_grad():
        worst = worst_row_diff(spy.rows, prompts, outputs, lambda ids: hf(torch.tensor([ids])).logits[0].float())
    assert worst <= 1e-4, f"max |logits - HF| = {worst:.3g}"

    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            gen = hf.generate(
                torch.tensor([prompt]),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                min_new_tokens=NEW_TOKENS,
                pad_token_id=0,
            )
        assert outputs[i] == gen[0, len(prompt) :].tolist(), f"r{i} greedy tokens differ"


def _spied_engine(path, caching, max_prefill):
    store = open_weights(path)
    registry = load_registry()
    spy = ForwardSpy(registry.find_model_loader(store.config).factory(store, LoadOptions()))
    engine = LLMEngine(
        spy,
        EngineConfig(block_size=4, num_kv_blocks=64, max_prefill_tokens=max_prefill, enable_prefix_caching=caching),
        registry=registry,
    )
    return engine, spy


def _run_all(engine, requests, params):
    for rid, prompt in requests:
        engine.add_request(rid, prompt, params)
        while engine.has_unfinished():
            engine.step()


def test_prefix_cache_hit_is_bit_identical_to_miss(tmp_path):
    """P's first 20 tokens come from blocks another request cached: P's logits (last prompt
    position and 7 decode positions) equal, bit for bit, a cold run computing the same chunks.

    Both runs compute P's uncached tail [20:22) as one chunk; the hit run took positions 0..19
    from the cache (written by Q, whose first chunk is also [0:20)), the miss run computed them.
    Across *different* chunkings, CPU GEMMs of different row counts differ in the last bits, so
    there the test asserts closeness instead.
    """
    model_cls, config = _qwen3(2, False, 32)
    save_checkpoint(model_cls, config, tmp_path)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    prompt = _prompts(seed=3)[3][:22]
    other = prompt[:20] + [5, 6, 7, 8, 9]

    cold, cold_spy = _spied_engine(tmp_path, caching=False, max_prefill=20)
    _run_all(cold, [("p", prompt)], params)
    warm, warm_spy = _spied_engine(tmp_path, caching=True, max_prefill=20)
    _run_all(warm, [("q", other), ("p", prompt)], params)
    assert warm.scheduler.block_manager.prefix_cache_stats().hits == 20

    cold_rows = dict(cold_spy.rows)
    warm_rows = {h: r for h, r in warm_spy.rows if h[:21] == tuple(prompt[:21])}
    assert len(cold_rows) == 8 and warm_rows.keys() == cold_rows.keys()
    for history, row in cold_rows.items():
        assert torch.equal(row, warm_rows[history]), f"position {len(history) - 1} differs"

    other_chunking, spy = _spied_engine(tmp_path, caching=False, max_prefill=7)
    _run_all(other_chunking, [("p", prompt)], params)
    for history, row in spy.rows:
        assert (row - cold_rows[history]).abs().max().item() <= 1e-5
