"""Greedy equivalence on the real SmolLM2-135M (n-gram, and the model as its own draft)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from spec_harness import run, streams

from metrale_core.sampling.params import SamplingParams
from metrale_speculative.draft_model import DraftModelProposer
from metrale_speculative.gate import SpecGate
from metrale_speculative.ngram import NgramProposer
from metrale_speculative.speculator import GatedSpeculator

GGUF = Path.home() / ".cache/metrale/models/SmolLM2-135M-Instruct.Q4_1.gguf"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not GGUF.exists(), reason="SmolLM2 GGUF not in the cache")]


def test_spec_smollm2_greedy_equivalence():
    torch.set_num_threads(2)
    from metrale_core.loading.load import load_model

    loaded = load_model(GGUF, progress=False)
    tok = loaded.tokenizer
    code = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n"
    prompt = tok.encode(f"Rename add to plus:\n{code}\nAnswer:\n")
    requests = [
        ("code", prompt, SamplingParams(temperature=0.0, max_tokens=24)),
        ("stop", tok.encode("Count: one, two, three,"), SamplingParams(temperature=0.0, max_tokens=20, stop=("five",))),
    ]
    expected = streams(run(loaded.model, requests, tokenizer=tok, block_size=16, num_kv_blocks=64))
    gate = SpecGate(force=True)
    for factory in (
        lambda ctx: GatedSpeculator(NgramProposer(2, 4), 4, gate=gate),
        lambda ctx: GatedSpeculator(
            DraftModelProposer(ctx.model, ctx.model.info, ctx.pipeline, num_blocks=64, block_size=16), 2, gate=gate
        ),
    ):
        got = run(loaded.model, requests, tokenizer=tok, block_size=16, num_kv_blocks=64, speculator=factory)
        assert streams(got) == expected
        assert got["_engine"].spec_driver.speculator.stats.drafts_accepted > 0
