"""The processor inside the real engine on a random Qwen3 config with the real Qwen3 tokenizer
(151,936 model rows, 151,669 tokenizer ids): speculative decoding (n-gram and the model as its own
draft) under a grammar gives the greedy output of plain decoding, token for
token; preemption/recompute and a mix of constrained and free rows leave outputs unchanged."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

jsonschema = pytest.importorskip("jsonschema")
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "plugins" / "metrale-speculative"
                       / "tests"))

from metrale_core.sampling import SamplingParams, StructuredOutput  # noqa: E402

from schemas import SCHEMAS  # noqa: E402
from structured_testlib import qwen3_dir  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    from metrale_core.loading import load_model

    torch.set_num_threads(2)
    return load_model(qwen3_dir(tmp_path_factory.mktemp("q3e")), progress=False)


def _requests(tok):
    prompt = tok.encode_chat([{"role": "user", "content": "Give two points as JSON."}],
                             enable_thinking=False)
    free = tok.encode_chat([{"role": "user", "content": "Count from one to ten."}],
                           enable_thinking=False)
    return [
        ("ref", prompt, SamplingParams(temperature=0.0, max_tokens=40, structured=StructuredOutput(
            "json_schema", json.dumps(SCHEMAS["ref-defs"]), "response_format"))),
        ("ints", prompt, SamplingParams(temperature=0.0, max_tokens=30, structured=StructuredOutput(
            "json_schema", json.dumps(SCHEMAS["array-ints"]), "response_format"))),
        ("free", free, SamplingParams(temperature=0.0, max_tokens=24)),
    ]


def _check_valid(result):
    assert result["ref"][1] == "stop" and result["ints"][1] == "stop"
    jsonschema.validate(json.loads(result["ref"][2]), SCHEMAS["ref-defs"])
    jsonschema.validate(json.loads(result["ints"][2]), SCHEMAS["array-ints"])


def test_speculative_greedy_equals_plain_greedy_under_a_grammar(qwen3):
    from metrale_core.plugins import load_registry
    from metrale_speculative.draft_model import DraftModelProposer
    from metrale_speculative.gate import SpecGate
    from metrale_speculative.ngram import NgramProposer
    from metrale_speculative.speculator import GatedSpeculator
    from spec_harness import run, streams

    registry, tok, model = load_registry(), qwen3.tokenizer, qwen3.model
    requests = _requests(tok)
    kw = dict(tokenizer=tok, registry=registry, block_size=16, num_kv_blocks=128)
    expected = streams(run(model, requests, **kw))
    _check_valid(expected)
    gate = SpecGate(force=True)
    for factory in (
        lambda ctx: GatedSpeculator(NgramProposer(1, 3), 4, gate=gate),
        lambda ctx: GatedSpeculator(DraftModelProposer(ctx.model, ctx.model.info, ctx.pipeline,
                                                       num_blocks=128, block_size=16), 3,
                                    gate=gate),
    ):
        got = run(model, requests, speculator=factory, **kw)
        assert streams(got) == expected
        assert got["_engine"].spec_driver.speculator.stats.num_verifies > 0


def test_preemption_recompute_and_mixed_batch_keep_outputs(qwen3):
    from metrale_core.plugins import load_registry
    from spec_harness import run, streams

    registry, tok, model = load_registry(), qwen3.tokenizer, qwen3.model
    requests = _requests(tok)
    requests += [(rid + "2", prompt, params) for rid, prompt, params in requests]
    alone = {}
    for rid, prompt, params in requests:  # each request alone, plenty of KV
        alone.update(streams(run(model, [(rid, prompt, params)], tokenizer=tok, registry=registry,
                                 block_size=16, num_kv_blocks=128)))
    # all together in a pool too small for all: some are preempted and recomputed
    tight = run(model, requests, tokenizer=tok, registry=registry, block_size=4, num_kv_blocks=16,
                max_prefill_tokens=16)
    assert tight["_engine"].scheduler.num_preemptions > 0
    assert streams(tight) == alone
    _check_valid(alone)
