"""Capacity: at a fixed KV byte budget an FP8 pool serves about twice the sequences of bf16."""

from __future__ import annotations

from fp8_testutil import load_checkpoint, write_checkpoint

from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.sampling.params import SamplingParams

BUDGET = 128 * 4 * 48  # bf16: 128 bytes/token x 4 tokens/block x 48 blocks


def max_concurrent(model, registry, kv_cache_dtype) -> tuple[int, int]:
    """Peak running sequences while 80 requests of 8 + 8 tokens go through; and the pool size."""
    config = EngineConfig(
        block_size=4,
        kv_cache_memory=BUDGET,
        max_num_seqs=512,
        kv_cache_dtype=kv_cache_dtype,
        enable_prefix_caching=False,
    )
    engine = LLMEngine(model, config, registry=registry)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    for i in range(80):
        engine.add_request(f"r{i}", [(i * 7 + j) % 60 + 3 for j in range(8)], params)
    peak = 0
    while engine.has_unfinished():
        engine.step()
        peak = max(peak, engine.stats().num_running)
    return peak, engine.stats().num_blocks


def test_fp8_holds_twice_the_sequences(tmp_path):
    model, registry = load_checkpoint(write_checkpoint(tmp_path / "c"))
    bf16_peak, bf16_blocks = max_concurrent(model, registry, "bf16")
    fp8_peak, fp8_blocks = max_concurrent(model, registry, "fp8")
    assert (bf16_blocks, fp8_blocks) == (48, 96)
    print(f"max concurrent sequences at {BUDGET} bytes: bf16 {bf16_peak}, fp8 {fp8_peak}")
    assert 1.8 <= fp8_peak / bf16_peak <= 2.2
