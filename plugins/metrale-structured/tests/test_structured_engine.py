"""The processor inside the real engine on a random Qwen3 config with the real Qwen3 tokenizer
(151,936 model rows, 151,669 tokenizer ids): speculative decoding (n-gram and the model as its own
draft) under a grammar gives the greedy output of plain decoding, token for
token; preemption/recompute and a mix of constrained and free rows leave outputs unchanged."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "plugins" / "metrale-speculative" / "tests"))

from schemas import SCHEMAS
from structured_testlib import qwen3_dir

from metrale_core.sampling import SamplingParams, StructuredOutput

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    from metrale_core.loading.load import load_model

    torch.set_num_threads(2)
    return load_model(qwen3_dir(tmp_path_factory.mktemp("q3e")), progress=False)


def _json_schema(name, max_tokens):
    """Greedy sampling of ``max_tokens`` constrained to ``SCHEMAS[name]`` (as ``response_format``)."""
    structured = StructuredOutput("json_schema", json.dumps(SCHEMAS[name]), "response_format")
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, structured=structured)


def _requests(tok):
    prompt = tok.encode_chat([{"role": "user", "content": "Give two points as JSON."}], enable_thinking=False)
    free = tok.encode_chat([{"role": "user", "content": "Count from one to ten."}], enable_thinking=False)
    return [
        ("ref", prompt, _json_schema("ref-defs", 40)),
        ("ints", prompt, _json_schema("array-ints", 30)),
        ("free", free, SamplingParams(temperature=0.0, max_tokens=24)),
    ]


def _check_valid(result):
    assert result["ref"][1] == "stop" and result["ints"][1] == "stop"
    jsonschema.validate(json.loads(result["ref"][2]), SCHEMAS["ref-defs"])
    jsonschema.validate(json.loads(result["ints"][2]), SCHEMAS["array-ints"])


def test_speculative_greedy_equals_plain_greedy_under_a_grammar(qwen3):
    from spec_harness import run, streams

    from metrale_core.plugin.discovery import load_registry
    from metrale_speculative.draft_model import DraftModelProposer
    from metrale_speculative.gate import SpecGate
    from metrale_speculative.ngram import NgramProposer
    from metrale_speculative.speculator import GatedSpeculator

    registry, tok, model = load_registry(), qwen3.tokenizer, qwen3.model
    requests = _requests(tok)
    kw = dict(tokenizer=tok, registry=registry, block_size=16, num_kv_blocks=128)
    expected = streams(run(model, requests, **kw))
    _check_valid(expected)
    gate = SpecGate(force=True)
    for factory in (
        lambda ctx: GatedSpeculator(NgramProposer(1, 3), 4, gate=gate),
        lambda ctx: GatedSpeculator(
            DraftModelProposer(ctx.model, ctx.model.info, ctx.pipeline, num_blocks=128, block_size=16), 3, gate=gate
        ),
    ):
        got = run(model, requests, speculator=factory, **kw)
        assert streams(got) == expected
        assert got["_engine"].spec_driver.speculator.stats.num_verifies > 0


def test_preemption_recompute_and_mixed_batch_keep_outputs(qwen3):
    from spec_harness import run, streams

    from metrale_core.plugin.discovery import load_registry

    registry, tok, model = load_registry(), qwen3.tokenizer, qwen3.model
    requests = _requests(tok)
    requests += [(rid + "2", prompt, params) for rid, prompt, params in requests]
    alone = {}
    for rid, prompt, params in requests:  # each request alone, plenty of KV
        alone.update(
            streams(
                run(model, [(rid, prompt, params)], tokenizer=tok, registry=registry, block_size=16, num_kv_blocks=128)
            )
        )
    # all together in a pool too small for all: some are preempted and recomputed
    tight = run(
        model, requests, tokenizer=tok, registry=registry, block_size=4, num_kv_blocks=16, max_prefill_tokens=16
    )
    assert tight["_engine"].scheduler.num_preemptions > 0
    assert streams(tight) == alone
    _check_valid(alone)


class _GarbageDrafts:
    """Proposes the same token three times for every sequence; counts drafts sent to verify."""

    def __init__(self, token: int) -> None:
        self.token = token
        self.verified: dict[str, int] = {}

    def propose(self, seqs, max_drafts):
        from metrale_core.engine.speculation import Draft

        return [Draft((self.token,) * 3) for _ in seqs]

    def observe(self, report) -> None:
        for o in report.outcomes:
            self.verified[o.request_id] = self.verified.get(o.request_id, 0) + o.num_proposed


def test_drafts_the_grammar_rejects_never_reach_verify(qwen3):
    from spec_harness import run, streams

    from metrale_core.plugin.discovery import load_registry

    registry, tok, model = load_registry(), qwen3.tokenizer, qwen3.model
    requests = [r for r in _requests(tok) if r[0] != "ref"]  # an int array: no strings
    kw = {"tokenizer": tok, "registry": registry, "block_size": 16, "num_kv_blocks": 128}
    expected = streams(run(model, requests, **kw))
    garbage = _GarbageDrafts(tok.encode("Hello")[0])  # never valid inside an int array
    got = run(model, requests, speculator=lambda ctx: garbage, **kw)
    assert streams(got) == expected
    assert garbage.verified.get("ints", 0) == 0  # trimmed to nothing before verify
    assert garbage.verified.get("free", 0) > 0  # a free row is still verified


def _collect(model, tok, registry, params, overlap=True):
    from metrale_core.engine import EngineConfig, LLMEngine

    engine = LLMEngine(model, EngineConfig(block_size=16, num_kv_blocks=128), tokenizer=tok, registry=registry)
    engine.output_processor.pipeline.processor("structured-output").overlap = overlap
    engine.add_request("r", _requests(tok)[0][1], params)
    tokens, text, logprobs, reason = [], "", [], None
    while engine.has_unfinished():
        for out in engine.step():
            tokens += out.new_token_ids
            text += out.text_delta
            logprobs += out.logprobs or ()
            reason = out.finish_reason or reason
    return engine, tokens, text, logprobs, reason


def test_grammar_with_logprobs_and_stop_strings(qwen3):
    """Logprobs are those of the constrained distribution (the mask applies before the sampler's
    log-softmax): every listed token is grammar-allowed and, where the grammar allows at most
    ``k`` tokens, the top ``k`` are exactly those and their probabilities sum to 1.  A stop
    string cuts the constrained output where it first appears."""
    import math

    from metrale_core.plugin.discovery import load_registry
    from metrale_structured.stats import STATS

    registry, tok, model = load_registry(), qwen3.tokenizer, qwen3.model
    schema = SCHEMAS["array-ints"]
    structured = StructuredOutput("json_schema", json.dumps(schema), "response_format")
    k = 20
    params = SamplingParams(temperature=0.0, max_tokens=30, logprobs=k, structured=structured)
    prepared = STATS.prepared_steps
    engine, tokens, text, logprobs, reason = _collect(model, tok, registry, params, overlap=True)
    assert STATS.prepared_steps > prepared  # the engine filled masks during the forward pass
    assert reason == "stop"
    jsonschema.validate(json.loads(text), schema)
    assert [t for t, _, _ in logprobs] == tokens
    proc = engine.output_processor.pipeline.processor("structured-output")
    small = 0
    for i, (token, logprob, top) in enumerate(logprobs):
        probe = SamplingParams(max_tokens=30, structured=structured)
        seq = type("Probe", (), {"params": probe, "output_ids": tokens[:i], "extras": {}, "request_id": "probe"})()
        logits = torch.zeros(1, model.info.vocab_size)
        proc(logits, type("Ctx", (), {"rows": [seq], "kinds": [None]})())
        allowed = set(torch.nonzero(logits[0] > float("-inf")).flatten().tolist())
        assert {t for t, _ in top} <= allowed and token in allowed
        assert abs(logprob - dict(top)[token]) < 1e-5
        if len(allowed) <= k:
            small += 1
            assert {t for t, _ in top} == allowed
            assert math.isclose(sum(math.exp(lp) for _, lp in top), 1.0, rel_tol=1e-4)
    assert small > 0  # the test saw positions where the grammar narrows to a few tokens

    stop = text[len(text) // 2 : len(text) // 2 + 2]
    params = SamplingParams(temperature=0.0, max_tokens=30, stop=[stop], structured=structured)
    _, _, cut, _, reason = _collect(model, tok, registry, params)
    assert reason == "stop" and cut == text[: text.index(stop)]
