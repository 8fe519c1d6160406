"""LLMEngine: request validation, stop rules, abort, timeout, text deltas, registry wiring."""

from __future__ import annotations

import pytest

from metrale_core.engine import EngineConfig, FcfsPolicy, LLMEngine
from metrale_core.errors import ConfigError, InvalidRequest, PromptTooLong
from metrale_core.plugin.components import LogitProcessorSpec, SamplerSpec, SchedulerSpec
from metrale_core.plugin.registry import Registry as _CoreRegistry
from metrale_core.sampling import DefaultSampler, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class CharTokenizer:
    """Token t is the letter chr(97 + t % 26); ``eos_token_ids`` configurable."""

    def __init__(self, eos=()):
        self.eos_token_ids = tuple(eos)

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + t % 26) for t in ids)


def greedy_alone(make_engine, run, tokens, prompt, **params):
    engine = make_engine()
    engine.add_request("x", prompt, SamplingParams(temperature=0.0, **params))
    return tokens(run(engine)["x"])


def test_bad_requests_are_refused(make_engine, toy_model):
    engine = make_engine(toy_model(max_position=16))
    with pytest.raises(InvalidRequest, match="empty"):
        engine.add_request("a", [], GREEDY)
    with pytest.raises(PromptTooLong, match="max_model_len=16"):
        engine.add_request("a", list(range(16)), GREEDY)
    engine.add_request("ok", list(range(15)), GREEDY)  # 15 + 1 output fits exactly
    with pytest.raises(InvalidRequest, match="outside the vocabulary"):
        engine.add_request("b", [1, 50], GREEDY)
    with pytest.raises(InvalidRequest, match="outside the vocabulary"):
        engine.add_request("b", [1, -1], GREEDY)
    with pytest.raises(InvalidRequest, match="already in use"):
        engine.add_request("ok", [1], GREEDY)
    for bad in (0, -3):
        with pytest.raises(ValueError, match="max_tokens"):
            SamplingParams(max_tokens=bad)
    assert list(engine.scheduler.seqs) == ["ok"]


def test_config_is_validated(toy_model):
    with pytest.raises(ConfigError, match="block_size"):
        EngineConfig(block_size=0)
    with pytest.raises(ConfigError, match="request_timeout_s"):
        EngineConfig(request_timeout_s=-1)
    with pytest.raises(ConfigError, match="kv_cache_memory"):
        LLMEngine(toy_model(), EngineConfig(kv_cache_memory=10))


def test_kv_budget_sets_block_count(toy_model):
    model = toy_model()
    per_token = model.info.kv.bytes_per_token()
    engine = LLMEngine(model, EngineConfig(block_size=4, kv_cache_memory=per_token * 4 * 10 + 3))
    assert engine.scheduler.block_manager.num_blocks == 10
    assert engine.runner.kv.num_blocks == 10
    engine = LLMEngine(model, EngineConfig(block_size=4, kv_cache_memory=1 << 30, num_kv_blocks=7))
    assert engine.runner.kv.num_blocks == 7


def test_generation_is_deterministic_and_reports_counts(make_engine, run, tokens):
    engine = make_engine()
    engine.add_request("a", [3, 1, 4, 1, 5, 9, 2, 6], SamplingParams(temperature=0.0, max_tokens=6))
    deltas = run(engine)["a"]
    assert [len(d.new_token_ids) for d in deltas] == [1] * 6
    assert [d.finished for d in deltas] == [False] * 5 + [True]
    last = deltas[-1]
    assert (last.finish_reason, last.num_prompt_tokens, last.num_output_tokens) == ("length", 8, 6)
    again = greedy_alone(make_engine, run, tokens, [3, 1, 4, 1, 5, 9, 2, 6], max_tokens=6)
    assert tokens(deltas) == again
    other = greedy_alone(make_engine, run, tokens, [3, 1, 4, 1, 5, 9, 2, 7], max_tokens=6)
    assert other != again  # the toy model really reads its context
    assert engine.stats().num_free_blocks == engine.stats().num_blocks


def test_eos_and_stop_token_ids(make_engine, run, tokens, toy_model):
    prompt = [7, 7, 1]
    free = greedy_alone(make_engine, run, tokens, prompt, max_tokens=6)
    eos = free[2]
    first = free.index(eos)
    engine = make_engine(toy_model(eos=(eos,)))
    engine.add_request("a", prompt, SamplingParams(temperature=0.0, max_tokens=6))
    engine.add_request("b", prompt, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    engine.add_request("c", prompt, SamplingParams(temperature=0.0, max_tokens=6, stop_token_ids=(free[1],)))
    outs = run(engine)
    assert tokens(outs["a"]) == free[: first + 1] and outs["a"][-1].finish_reason == "stop"
    assert tokens(outs["b"]) == free and outs["b"][-1].finish_reason == "length"
    assert tokens(outs["c"]) == free[: free.index(free[1]) + 1]
    assert outs["c"][-1].finish_reason == "stop"


def test_context_full_finishes_with_length(make_engine, run, tokens, toy_model):
    engine = make_engine(toy_model(max_position=12))
    engine.add_request("a", list(range(1, 10)), SamplingParams(temperature=0.0, max_tokens=100))
    deltas = run(engine)["a"]
    assert len(tokens(deltas)) == 3 and deltas[-1].finish_reason == "length"


def test_text_deltas_and_stop_strings(make_engine, run, tokens):
    prompt = [2, 5, 8]
    ids = greedy_alone(make_engine, run, tokens, prompt, max_tokens=10)
    text = "".join(chr(97 + t % 26) for t in ids)
    engine = make_engine(tokenizer=CharTokenizer())
    engine.add_request("plain", prompt, SamplingParams(temperature=0.0, max_tokens=10))
    stop = text[4:6]
    engine.add_request("stop", prompt, SamplingParams(temperature=0.0, max_tokens=10, stop=(stop,)))
    outs = run(engine)
    assert "".join(d.text_delta for d in outs["plain"]) == text
    streamed = "".join(d.text_delta for d in outs["stop"])
    assert streamed == text[: text.index(stop)]
    assert outs["stop"][-1].finish_reason == "stop"
    # The first character of the stop string was held back, never emitted then withdrawn.
    assert all(stop not in d.text_delta for d in outs["stop"])


def test_eos_text_is_not_emitted(make_engine, run, tokens, toy_model):
    prompt = [2, 5, 8]
    ids = greedy_alone(make_engine, run, tokens, prompt, max_tokens=10)
    eos = ids[3]
    engine = make_engine(toy_model(), tokenizer=CharTokenizer(eos=(eos,)))
    engine.add_request("a", prompt, SamplingParams(temperature=0.0, max_tokens=10))
    deltas = run(engine)["a"]
    n = ids.index(eos)
    assert tokens(deltas) == ids[: n + 1]
    assert "".join(d.text_delta for d in deltas) == "".join(chr(97 + t % 26) for t in ids[:n])


def test_abort_frees_blocks_at_once(make_engine, run):
    engine = make_engine()
    engine.add_request("a", list(range(1, 20)), SamplingParams(temperature=0.0, max_tokens=50))
    engine.add_request("b", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=5))
    for _ in range(3):
        engine.step()
    bm = engine.scheduler.block_manager
    held = list(engine.scheduler.seqs["a"].block_ids)
    assert held and all(bm.ref_count(b) == 1 for b in held)
    free_before = bm.num_free_blocks
    assert engine.abort("a") is True
    assert all(bm.ref_count(b) == 0 for b in held)
    assert bm.num_free_blocks == free_before + len(held)
    assert engine.abort("a") is False and engine.abort("nope") is False
    outs = run(engine)
    assert outs["a"] == [outs["a"][0]] and outs["a"][0].finish_reason == "abort"
    assert outs["a"][0].finished and outs["a"][0].new_token_ids == ()
    assert outs["b"][-1].finish_reason == "length"


def test_timeout_uses_the_injected_clock(make_engine, run):
    clock = FakeClock()
    engine = make_engine(clock=clock, request_timeout_s=5.0)
    engine.add_request("slow", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=100))
    engine.add_request("own", [4, 5], SamplingParams(temperature=0.0, max_tokens=100), timeout_s=1.0)
    engine.add_request("later", [4, 5], SamplingParams(temperature=0.0, max_tokens=100))
    assert len(engine.step()) == 3
    clock.now += 1.0  # "own" is due
    outs = engine.step()
    own = [o for o in outs if o.request_id == "own"]
    assert own[0].finished and own[0].finish_reason == "timeout"
    clock.now += 4.0
    outs = run(engine)
    assert outs["slow"][-1].finish_reason == "timeout" and outs["later"][-1].finish_reason == "timeout"
    assert engine.stats().num_free_blocks == engine.stats().num_blocks


def test_logprobs_are_reported(make_engine, run):
    engine = make_engine()
    engine.add_request("a", [1, 2], SamplingParams(temperature=0.0, max_tokens=3, logprobs=2))
    engine.add_request("b", [1, 2], SamplingParams(temperature=0.0, max_tokens=3))
    outs = run(engine)
    for d in outs["a"]:
        ((token, lp, top),) = d.logprobs
        assert token == d.new_token_ids[0] and lp <= 0.0
        assert len(top) == 2 and top[0][0] == token
    assert all(d.logprobs is None for d in outs["b"])


class _Registry(_CoreRegistry):
    def __init__(self, calls):
        super().__init__()  # a real (typed) Registry with an empty plugin manager

        def observer(config):
            def observe(logits, ctx):
                calls.append(ctx.kinds)

            return observe

        self.samplers = {"default": SamplerSpec("default", DefaultSampler)}
        self.schedulers = {"fcfs": SchedulerSpec("fcfs", FcfsPolicy)}
        self.logit_processors = {
            "watch": LogitProcessorSpec("watch", observer, read_only=True),
            "off": LogitProcessorSpec("off", lambda cfg: 1 / 0, default_enabled=False),
        }


def test_components_come_from_the_registry(toy_model, run, tokens):
    calls = []
    cfg = EngineConfig(block_size=4, num_kv_blocks=32)
    engine = LLMEngine(toy_model(), cfg, registry=_Registry(calls))
    assert isinstance(engine.scheduler.policy, FcfsPolicy)
    engine.add_request("a", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=3))
    run(engine)
    from metrale_core.sampling import PositionKind

    assert [k for ks in calls for k in ks] == [PositionKind.PREFILL_LAST] + [PositionKind.FINAL_DECODE] * 2
    with pytest.raises(ConfigError, match=r"no sampler named 'fancy'.*default"):
        LLMEngine(toy_model(), EngineConfig(num_kv_blocks=8, sampler="fancy"), registry=_Registry([]))
    with pytest.raises(ConfigError, match="scheduler"):
        LLMEngine(toy_model(), EngineConfig(num_kv_blocks=8, scheduler="prio"))


def test_failed_step_fails_its_requests(make_engine, toy_model):
    model = toy_model()
    engine = make_engine(model)
    engine.add_request("a", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=5))
    engine.step()

    def broken(batch, kv, state=None):
        raise RuntimeError("device lost")

    model.forward = broken
    with pytest.raises(RuntimeError, match="device lost"):
        engine.step()
    outs = engine.fail_in_flight("RuntimeError: device lost")
    assert [(o.request_id, o.finish_reason, o.error) for o in outs] == [("a", "error", "RuntimeError: device lost")]
    assert not engine.has_unfinished()
    assert engine.stats().num_free_blocks == engine.stats().num_blocks


def test_a_checked_record_is_queued_as_it_is(make_engine, run, tokens, monkeypatch):
    """``validate_request`` returns the typed ``EngineRequest``; ``add_request`` queues it without
    checking it again and the request runs as the positional form's does."""
    from metrale_core.engine.request import EngineRequest

    legacy = make_engine()
    legacy.add_request("r", [3, 4, 5], GREEDY, timeout_s=30.0)
    expected = tokens(run(legacy)["r"])

    engine = make_engine()
    record = engine.validate_request("r", [3, 4, 5], GREEDY, timeout_s=30.0, extras={"tag": 1})
    assert isinstance(record, EngineRequest)
    assert (record.request_id, record.prompt_ids, record.params) == ("r", (3, 4, 5), GREEDY)
    assert (record.timeout_s, record.extras) == (30.0, {"tag": 1})

    def refuse(*args, **kwargs):
        raise AssertionError("a checked record was validated again")

    monkeypatch.setattr(engine, "validate_request", refuse)
    engine.add_request(record)
    assert engine.scheduler.seqs["r"].extras["tag"] == 1
    assert engine.scheduler.seqs["r"].deadline == pytest.approx(engine.config.clock() + 30.0, abs=5.0)
    with pytest.raises(InvalidRequest, match="already in use"):  # the one check left: the id is free
        engine.add_request(record)
    assert tokens(run(engine)["r"]) == expected


def test_validate_request_refuses_bad_timeouts_and_extras(make_engine):
    engine = make_engine()
    with pytest.raises(InvalidRequest, match="timeout_s must be > 0"):
        engine.validate_request("a", [1], GREEDY, timeout_s=0)
    with pytest.raises(InvalidRequest, match="extras must be a dict"):
        engine.validate_request("a", [1], GREEDY, extras=[("k", 1)])  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="non-empty string"):
        engine.validate_request("", [1], GREEDY)
