"""AsyncEngine: streaming on an engine thread, cancellation, failed steps, shutdown."""

from __future__ import annotations

import asyncio
import time

import pytest

from metrale_core.engine import AsyncEngine, EngineStopped
from metrale_core.errors import InvalidRequest
from metrale_core.sampling import SamplingParams


def wait_until(predicate, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.005)
    return False


@pytest.fixture
def async_engine(make_engine):
    engines = []

    def make(model=None, **config):
        eng = AsyncEngine(make_engine(model, **config))
        eng.start()
        engines.append(eng)
        return eng

    yield make
    for eng in engines:
        eng.shutdown()
        assert not eng.is_running


async def collect(agen):
    return [d async for d in agen]


def test_streams_the_same_tokens_as_the_sync_engine(async_engine, make_engine, run, tokens):
    prompts = [[1, 2, 3], list(range(5, 25)), [9]]
    expected = []
    for p in prompts:
        e = make_engine()
        e.add_request("x", p, SamplingParams(temperature=0.0, max_tokens=6))
        expected.append(tokens(run(e)["x"]))
    eng = async_engine(max_prefill_tokens=8)

    async def main():
        return await asyncio.gather(
            *(
                collect(eng.generate(p, SamplingParams(temperature=0.0, max_tokens=6), request_id=f"r{i}"))
                for i, p in enumerate(prompts)
            )
        )

    results = asyncio.run(main())
    for deltas, want in zip(results, expected):
        assert tokens(deltas) == want
        assert [d.finished for d in deltas] == [False] * (len(deltas) - 1) + [True]
        assert deltas[-1].finish_reason == "length"


def test_bad_request_raises_before_streaming(async_engine):
    eng = async_engine()

    async def main():
        with pytest.raises(InvalidRequest, match="empty"):
            await collect(eng.generate([], SamplingParams()))
        with pytest.raises(InvalidRequest, match="vocabulary"):
            await collect(eng.generate([1, 999], SamplingParams()))

    asyncio.run(main())


def test_aclose_aborts_and_frees_blocks(async_engine):
    eng = async_engine()
    engine = eng.engine

    async def main():
        agen = eng.generate(
            [1, 2, 3, 4, 5], SamplingParams(temperature=0.0, max_tokens=10_000, ignore_eos=True), request_id="long"
        )
        first = await agen.__anext__()
        assert first.new_token_ids and not first.finished
        await agen.aclose()

    asyncio.run(main())
    assert wait_until(lambda: not engine.has_unfinished())
    stats = engine.stats()
    assert stats.num_free_blocks == stats.num_blocks and stats.num_running == 0


def test_cancelled_consumer_aborts(async_engine):
    eng = async_engine()
    engine = eng.engine
    seen = []

    async def consume():
        async for d in eng.generate([7, 8], SamplingParams(temperature=0.0, max_tokens=10_000), request_id="c"):
            seen.append(d)

    async def main():
        task = asyncio.create_task(consume())
        while not seen:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert wait_until(lambda: not engine.has_unfinished())
    assert engine.stats().num_free_blocks == engine.stats().num_blocks


def test_a_failing_step_fails_its_requests_and_the_loop_survives(async_engine, toy_model):
    model = toy_model()
    real_forward = model.forward
    eng = async_engine(model)

    def flaky(batch, kv, state=None):
        if 13 in batch.input_ids.tolist():
            raise RuntimeError("kernel fault")
        return real_forward(batch, kv, state)

    model.forward = flaky

    async def main():
        bad = await collect(eng.generate([13, 1], SamplingParams(temperature=0.0, max_tokens=3)))
        good = await collect(eng.generate([1, 2], SamplingParams(temperature=0.0, max_tokens=3)))
        return bad, good

    bad, good = asyncio.run(main())
    assert len(bad) == 1 and bad[0].finish_reason == "error"
    assert "kernel fault" in bad[0].error
    assert good[-1].finish_reason == "length"
    # deltas may be coalesced when the loop falls behind; the tokens and the steps they span may not
    assert sum(len(d.new_token_ids) for d in good) == 3 == sum(d.steps for d in good)
    assert eng.is_running


def test_shutdown_aborts_pending_and_joins(make_engine):
    eng = AsyncEngine(make_engine())
    eng.start()

    async def main():
        agen = eng.generate([1, 2], SamplingParams(temperature=0.0, max_tokens=10_000), request_id="p")
        deltas = [await agen.__anext__()]
        await asyncio.get_running_loop().run_in_executor(None, eng.shutdown)
        async for d in agen:
            deltas.append(d)
        return deltas

    deltas = asyncio.run(main())
    assert deltas[-1].finished and deltas[-1].finish_reason == "abort"
    assert not eng.is_running

    async def after():
        await collect(eng.generate([1], SamplingParams()))

    with pytest.raises(EngineStopped):
        asyncio.run(after())


def test_a_consumer_behind_gets_the_waiting_deltas_merged(async_engine, make_engine, run, tokens):
    """A consumer that sleeps while the engine steps receives fewer, merged deltas carrying the
    same tokens, text and logprobs, in order, ending with the one finished delta."""
    prompt, params = [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=12, logprobs=1)
    e = make_engine()
    e.add_request("x", prompt, params)
    alone = run(e)["x"]
    eng = async_engine()

    async def slow():
        out = []
        async for d in eng.generate(prompt, params, request_id="slow"):
            out.append(d)
            await asyncio.sleep(0.05)  # the engine runs ahead meanwhile (blocking the loop)
        return out

    deltas = asyncio.run(slow())
    assert tokens(deltas) == tokens(alone)
    assert len(deltas) < len(alone)
    assert "".join(d.text_delta for d in deltas) == "".join(d.text_delta for d in alone)
    assert [t for d in deltas for t, *_ in d.logprobs] == tokens(alone)
    assert [d.finished for d in deltas] == [False] * (len(deltas) - 1) + [True]
    assert deltas[-1].num_output_tokens == 12
    # each engine step here carries one token: the merged deltas still account for every step
    assert sum(d.steps for d in deltas) == len(alone) == sum(1 for d in alone if d.new_token_ids)


def test_merge_outputs_concatenates_in_order():
    from metrale_core.engine.deltas import RequestOutput, merge_outputs

    a = RequestOutput("r", (1,), "a", num_output_tokens=1, logprobs=((1, -0.5, ()),), parsed=("p",))
    b = RequestOutput(
        "r",
        (2, 3),
        "bc",
        finished=True,
        finish_reason="length",
        num_output_tokens=3,
        logprobs=((2, -1.0, ()), (3, -2.0, ())),
    )
    m = merge_outputs([a, b])
    assert (m.new_token_ids, m.text_delta, m.finished, m.finish_reason, m.num_output_tokens) == (
        (1, 2, 3),
        "abc",
        True,
        "length",
        3,
    )
    assert [t for t, *_ in m.logprobs] == [1, 2, 3] and m.parsed == ("p",)
    assert merge_outputs([RequestOutput("r", (1,)), RequestOutput("r", (2,))]).logprobs is None


class _Recording(AsyncEngine):
    """Records what each hand-over carries (``_send``'s items), then hands it over as usual."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.handed: list[list] = []

    def _send(self, items):
        self.handed.append([item for _, item in items])
        return super()._send(items)


def _stepping_clock(engine, step_s: float):
    """A clock that advances ``step_s`` with each ``engine.step()`` (a model of that pace)."""
    now = [0.0]
    step = engine.step

    def timed_step():
        now[0] += step_s
        return step()

    engine.step = timed_step
    return lambda: now[0]


@pytest.mark.parametrize(("interval_s", "sizes"), [(0.02, [1, 4, 4, 3]), (0.0, [1] * 12)])
def test_paced_streams_hand_over_merged_deltas_at_the_interval(make_engine, run, tokens, interval_s, sizes):
    """6 ms steps, 20 ms interval: the first token at once, then four steps' tokens per hand-over,
    the final delta at once; the consumer gets every token in order and every step counted."""
    prompt, params = [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=12, logprobs=1)
    e = make_engine()
    e.add_request("x", prompt, params)
    alone = run(e)["x"]
    engine = make_engine()
    eng = _Recording(engine, stream_interval_s=interval_s, clock=_stepping_clock(engine, 0.006))
    eng.start()
    try:
        deltas = asyncio.run(collect(eng.generate(prompt, params, request_id="x")))
    finally:
        eng.shutdown()
    handed = [d for batch in eng.handed for d in batch]
    assert [len(d.new_token_ids) for d in handed] == sizes
    assert [d.steps for d in handed] == sizes
    assert [d.finished for d in handed] == [False] * (len(sizes) - 1) + [True]
    assert tokens(deltas) == tokens(alone)
    assert "".join(d.text_delta for d in deltas) == "".join(d.text_delta for d in alone)
    assert [t for d in deltas for t, *_ in d.logprobs] == tokens(alone)
    assert sum(d.steps for d in deltas) == 12
    assert not eng._held and not eng._handed  # nothing left behind for a finished request


def test_paced_deltas_of_a_request_not_stepped_are_handed_over_when_due(make_engine):
    """Held tokens of a request the next steps do not run (preempted, say) still go out once the
    interval has passed, carried by another request's step; an abort drops what is held."""
    from metrale_core.engine.deltas import RequestOutput

    now = [0.0]
    eng = AsyncEngine(make_engine(), stream_interval_s=0.02, clock=lambda: now[0])
    first = eng._paced([RequestOutput("a", (1,), "x"), RequestOutput("b", (5,), "p")])
    assert [(o.request_id, o.new_token_ids) for o in first] == [("a", (1,)), ("b", (5,))]
    now[0] = 0.01
    assert eng._paced([RequestOutput("a", (2,), "y"), RequestOutput("b", (6,), "q")]) == []
    now[0] = 0.025  # only b steps; a's held token is due
    due = eng._paced([RequestOutput("b", (7,), "r")])
    assert sorted((o.request_id, o.new_token_ids, o.text_delta) for o in due) == [("a", (2,), "y"), ("b", (6, 7), "qr")]
    now[0] = 0.03
    assert eng._paced([RequestOutput("b", (8,), "s")]) == []
    eng._handle(("abort", "b"))
    assert "b" not in eng._held and "b" not in eng._handed


def test_paced_state_of_a_request_whose_consumer_is_gone_is_dropped(make_engine):
    """A hand-over that finds no consumer (the client went away) aborts the request and forgets
    its pacing state, so a long-running server keeps none for requests nobody reads."""
    from metrale_core.engine.deltas import RequestOutput

    now = [0.0]
    eng = AsyncEngine(make_engine(), stream_interval_s=0.02, clock=lambda: now[0])
    eng._deliver([RequestOutput("gone", (1,), "x")])  # nobody listens: handed over, found lost
    assert "gone" not in eng._handed and "gone" not in eng._held
    eng._paced([RequestOutput("c", (1,), "x")])
    now[0] = 0.01
    eng._paced([RequestOutput("c", (2,), "y")])  # held
    now[0] = 0.03
    eng._deliver([RequestOutput("c", (3,), "z")])  # due, merged, and its consumer is gone
    assert not eng._held and not eng._handed


def test_a_checked_record_crosses_to_the_engine_thread_as_it_is(async_engine, make_engine, run, tokens, monkeypatch):
    """``generate(EngineRequest)`` puts that very record in the inbox and nobody checks it again;
    the positional form checks once (on the caller's thread) and sends its record too."""
    from metrale_core.engine import LLMEngine
    from metrale_core.engine.request import EngineRequest

    params = SamplingParams(temperature=0.0, max_tokens=5)
    expected = make_engine()
    expected.add_request("x", [4, 5, 6], params)
    want = tokens(run(expected)["x"])

    eng = async_engine()
    checks: list[str] = []
    validate = LLMEngine.validate_request

    def counting(self, request_id, *args, **kwargs):
        checks.append(request_id)
        return validate(self, request_id, *args, **kwargs)

    monkeypatch.setattr(LLMEngine, "validate_request", counting)
    sent: list = []
    put = eng._inbox.put
    monkeypatch.setattr(eng._inbox, "put", lambda item: (sent.append(item), put(item)))
    record = eng.engine.validate_request("rec", [4, 5, 6], params)
    assert checks == ["rec"]
    got = asyncio.run(collect(eng.generate(record)))
    assert checks == ["rec"]  # not checked again, on either thread
    assert sent == [record]
    assert [t for d in got for t in d.new_token_ids] == want
    got = asyncio.run(collect(eng.generate([4, 5, 6], params, request_id="pos")))
    assert checks == ["rec", "pos"]
    assert isinstance(sent[-1], EngineRequest) and sent[-1].request_id == "pos"
    assert [t for d in got for t in d.new_token_ids] == want
