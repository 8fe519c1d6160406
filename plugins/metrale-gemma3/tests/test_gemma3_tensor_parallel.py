"""Gemma 3 at TP=2 (a worker process, gloo on loopback) against TP=1 through the real engine path:
sliding-window and global layers, final soft-capping, an uneven MLP split (64 + 32 columns),
chunked prefill, batched decode and a forced preemption; logits within 1e-5, greedy tokens equal."""

from __future__ import annotations

import torch
from gemma3_harness import VOCAB, save_checkpoint

from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.loading.load import load_model
from metrale_core.parallel.launch import load_parallel
from metrale_core.plugin.components import LoadOptions
from metrale_core.sampling import SamplingParams
from metrale_core.testing.tensor_parallel import run_recording

PROMPTS = [[(11 * i + 5 * j) % (VOCAB - 3) + 3 for j in range(8 + 5 * i)] for i in range(4)]


def _run(model):
    config = EngineConfig(block_size=4, num_kv_blocks=24, max_prefill_tokens=8, max_num_seqs=4)
    return run_recording(
        LLMEngine(model, config), PROMPTS, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    )


def test_gemma3_tp2_matches_tp1_through_the_engine(tmp_path):
    from tokenizers import Tokenizer, models

    save_checkpoint("window6-softcap", tmp_path)
    Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0")).save(
        str(tmp_path / "tokenizer.json")
    )
    options = LoadOptions(weight_format="exact")
    single = _run(load_model(tmp_path, options, progress=False).model)
    loaded = load_parallel(tmp_path, options, size=2, backend="mp", threads=1, progress=False)
    try:
        assert loaded.model.info.kv.num_kv_heads == 1
        split = _run(loaded.model)
    finally:
        loaded.model.close()
    assert split.preemptions > 0 and split.batched_decode_steps > 0 and split.partial_prefill_steps > 0
    assert split.tokens == single.tokens
    for a, b in zip(split.logits, single.logits, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=0), (a - b).abs().max().item()
