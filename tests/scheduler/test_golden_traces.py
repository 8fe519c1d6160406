"""Golden-trace scenarios: the real LLMEngine over the recording fake model.

Each scenario's trace (the ordered model calls, every engine output, then each client's whole
stream) is compared with ``tests/golden/<name>.trace``; regenerate with ``--update-goldens`` and
read the diff before checking it in.  Each test also asserts the scenario's point directly, so a
wrong golden cannot hide a bug: the streams match the scripts, finish reasons are right and the
model saw no readback error.

Pool sizes are in blocks of 4 tokens (the scenario defaults: 64 blocks, 64 prefill tokens,
8 sequences); token ids are < 64, and every prompt starts with a distinct token (the model's key).
"""

from __future__ import annotations

import itertools
import re

import pytest

from metrale_core.testing import EOS, GARBAGE, Abort, Advance, Arrive, Scenario, ScenarioResult, run_scenario

#: The windowed scenarios' window (positions) over blocks of 4 tokens.
WINDOW = 6


def prompt(first: int, n: int) -> list[int]:
    return [first + i for i in range(n)]


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario(
            "plain_decode",
            [
                Arrive(0, "r10", prompt(10, 5), [40, 41, 42, 43]),  # ends with EOS -> stop
                Arrive(0, "r30", prompt(30, 3), [50, 51, 52, 53, 54], max_tokens=3),  # -> length
            ],
        ),
        Scenario(
            "chunked_prefill",
            [
                Arrive(0, "r10", prompt(10, 10), [40, 41, 42]),
            ],
            engine=dict(max_prefill_tokens=4),
        ),
        Scenario(
            "mixed_prefill_decode",
            [
                Arrive(0, "r10", prompt(10, 3), [40, 41, 42, 43, 44, 45]),
                Arrive(2, "r20", prompt(20, 9), [50, 51]),
            ],
            engine=dict(max_prefill_tokens=4),
        ),
        Scenario(
            "batched_prefill_waves",
            [
                Arrive(0, "r10", prompt(10, 3), [40, 41]),
                Arrive(0, "r20", prompt(20, 3), [42, 43]),
                Arrive(0, "r30", prompt(30, 3), [44, 45]),
                Arrive(0, "r50", prompt(50, 3), [46, 47]),
            ],
            engine=dict(max_prefill_tokens=7),
        ),
        Scenario(
            "preempt_requeue",
            [
                Arrive(0, "r10", prompt(10, 6), prompt(40, 10), max_tokens=10, ignore_eos=True),
                Arrive(0, "r20", prompt(20, 6), prompt(50, 10), max_tokens=10, ignore_eos=True),
            ],
            engine=dict(num_kv_blocks=6),
        ),
        Scenario(
            "cancel_mid_stream",
            [
                Arrive(0, "r10", prompt(10, 4), prompt(40, 8)),
                Arrive(0, "r20", prompt(20, 4), prompt(50, 5)),
                Abort(3, "r10"),
            ],
        ),
        Scenario(
            "request_timeout",
            [
                Arrive(0, "r10", prompt(10, 4), prompt(40, 8), timeout_s=5.0),
                Arrive(0, "r20", prompt(20, 4), prompt(50, 5)),
                Advance(2, 3.0),
                Advance(4, 3.0),
            ],
        ),
        Scenario(
            "kv_exhausted_single_sequence",
            [
                Arrive(0, "r10", prompt(10, 20), [40]),  # never fits 4 blocks
                Arrive(0, "r20", prompt(20, 6), prompt(40, 14), max_tokens=14, ignore_eos=True),
                Arrive(0, "r30", prompt(30, 3), [55, 56]),
            ],
            engine=dict(num_kv_blocks=4),
        ),
        Scenario(
            "model_kv_exhausted",
            [
                Arrive(0, "r10", prompt(10, 4), prompt(40, 5)),
                Arrive(0, "r20", prompt(20, 4), prompt(50, 5)),
                Arrive(1, "r30", prompt(30, 4), prompt(56, 3)),  # waits: max_num_seqs=2
            ],
            engine=dict(max_num_seqs=2),
            model=dict(fail_kv_at_steps={2}),
        ),
        Scenario(
            "recurrent_preempt_chunked",
            [
                Arrive(0, "r10", prompt(10, 7), prompt(40, 9), max_tokens=9, ignore_eos=True),
                Arrive(0, "r20", prompt(20, 6), prompt(50, 8), max_tokens=8, ignore_eos=True),
                Arrive(1, "r30", prompt(30, 5), [58, 59, 60]),
            ],
            engine=dict(num_kv_blocks=7, max_prefill_tokens=4),
            model=dict(recurrent_fed_rows=True),
        ),
        # windowed mode: a global layer and a layer with a window of 6 positions (two KV groups)
        Scenario(
            "window_long_decode",
            [
                Arrive(0, "r10", prompt(10, 5), prompt(20, 30), max_tokens=30, ignore_eos=True),
            ],
            model={"window": WINDOW},
        ),
        Scenario(
            "window_preempt_resume",
            [
                Arrive(0, "r10", prompt(10, 6), prompt(40, 14), max_tokens=14, ignore_eos=True),
                Arrive(0, "r20", prompt(20, 6), prompt(50, 14), max_tokens=14, ignore_eos=True),
            ],
            engine={"num_kv_blocks": 12},
            model={"window": WINDOW},
        ),
        Scenario(
            "window_prefix_hit",
            [
                Arrive(0, "r10", prompt(10, 13), prompt(30, 12), max_tokens=12, ignore_eos=True),
                Arrive(14, "r10b", prompt(10, 13), prompt(30, 12), max_tokens=12, ignore_eos=True),
            ],
            model={"window": WINDOW},
        ),
    ]
}


def script_of(scenario: Scenario, request_id: str) -> list[int]:
    """The stream a request should see: its script, then EOS (which a "stop" stream ends with)."""
    return next(list(e.output) + [EOS] for e in scenario.events if isinstance(e, Arrive) and e.request_id == request_id)


def run(name: str, golden) -> ScenarioResult:
    result = run_scenario(SCENARIOS[name])
    golden(name, result.trace)
    assert result.model.errors == [], result.trace
    assert "!!" not in result.trace.replace("!! engine.step raised", ""), result.trace
    for stream in result.streams.values():
        assert stream.finished, result.trace
        assert GARBAGE not in stream.token_ids, result.trace
    return result


def assert_follows_script(result: ScenarioResult, request_id: str, n: int | None = None) -> None:
    scenario = SCENARIOS[result.trace.splitlines()[0].removeprefix("# scenario ")]
    want = script_of(scenario, request_id)
    got = result.streams[request_id].token_ids
    assert got == want[: len(got)], result.trace
    if n is not None:
        assert len(got) == n, result.trace


def fed_positions(result: ScenarioResult) -> dict[int, list[tuple[int, int, bool]]]:
    """Per key, every (start, rows, fresh) the model was fed, in order."""
    fed: dict[int, list[tuple[int, int, bool]]] = {}
    for call in result.model.calls:
        for s in call.seqs:
            fed.setdefault(s.key, []).append((s.start, s.num_rows, s.fresh))
    return fed


def test_plain_decode(golden):
    result = run("plain_decode", golden)
    assert_follows_script(result, "r10", 5)  # 4 script tokens, then EOS
    assert result.streams["r10"].finish_reason == "stop"
    assert_follows_script(result, "r30", 3)
    assert result.streams["r30"].finish_reason == "length"
    # one batched forward per step after the shared prefill: never more rows than sequences
    assert all(s.num_rows == 1 for call in result.model.calls[1:] for s in call.seqs)


def test_chunked_prefill(golden):
    result = run("chunked_prefill", golden)
    assert fed_positions(result)[10][:3] == [(0, 4, True), (4, 4, False), (8, 2, False)]
    assert [c.seqs[0].answers for c in result.model.calls[:3]] == [(), (), (40,)]
    assert_follows_script(result, "r10", 4)


def test_mixed_prefill_decode(golden):
    result = run("mixed_prefill_decode", golden)
    mixed = [
        c for c in result.model.calls if {s.key for s in c.seqs} == {10, 20} and any(s.num_rows > 1 for s in c.seqs)
    ]
    assert mixed, "no forward mixed a decode row with a prefill chunk"
    assert all(s.num_rows <= 4 for c in result.model.calls for s in c.seqs if s.key == 20)
    assert_follows_script(result, "r10", 7)
    assert_follows_script(result, "r20", 3)


def test_batched_prefill_waves(golden):
    result = run("batched_prefill_waves", golden)
    first = result.model.calls[0]
    assert sum(s.num_rows for s in first.seqs) <= 7 and len(first.seqs) >= 2
    for rid in ("r10", "r20", "r30", "r50"):
        assert_follows_script(result, rid, 3)


def test_preempt_requeue(golden):
    result = run("preempt_requeue", golden)
    # r20 (admitted last) is the victim: it leaves the running list, then replays its history
    # from the prefix cache's longest hit, sampling only the token after its last one
    assert "~ running=1 waiting=1 free_blocks=2/6" in result.trace
    fed = fed_positions(result)[20]
    replays = [(a, b) for a, b in itertools.pairwise(fed) if b[0] < a[0] + a[1]]
    assert len(replays) == 1, fed
    ((before, replay),) = replays
    assert replay[0] % 4 == 0 and replay[0] + replay[1] == before[0] + before[1] + 1
    assert all(c.seqs[0].key == 10 for c in result.model.calls[7:10]), "r10 did not keep running"
    for rid in ("r10", "r20"):
        assert_follows_script(result, rid, 10)
        assert result.streams[rid].finish_reason == "length"


def test_cancel_mid_stream(golden):
    result = run("cancel_mid_stream", golden)
    r10 = result.streams["r10"]
    assert r10.finish_reason == "abort" and 0 < len(r10.token_ids) < 8
    assert_follows_script(result, "r10")
    abort_at = result.trace.splitlines().index("+ abort r10")
    assert not any(line.startswith("forward") and "s10@" in line for line in result.trace.splitlines()[abort_at:]), (
        "r10 ran after its abort"
    )
    assert_follows_script(result, "r20", 6)
    assert result.streams["r20"].finish_reason == "stop"


def test_request_timeout(golden):
    result = run("request_timeout", golden)
    r10 = result.streams["r10"]
    assert r10.finish_reason == "timeout" and 0 < len(r10.token_ids) < 8
    assert_follows_script(result, "r10")
    assert_follows_script(result, "r20", 6)
    assert result.streams["r20"].finish_reason == "stop"


def test_kv_exhausted_single_sequence(golden):
    result = run("kv_exhausted_single_sequence", golden)
    r10, r20 = result.streams["r10"], result.streams["r20"]
    assert r10.finish_reason == "error" and r10.token_ids == []
    assert "KV blocks" in r10.error and "num_kv_blocks" in r10.error
    # r20 alone needs 20 tokens = 5 blocks > 4: it fails once it cannot grow, keeping its tokens
    assert r20.finish_reason == "error" and "KV blocks" in r20.error
    assert_follows_script(result, "r20")
    assert len(r20.token_ids) == 4 * 4 - 6 + 1  # the token sampled at position 15 still counts
    assert "~ running=0 waiting=0 free_blocks=4/4" in result.trace.splitlines()[-5:]
    assert_follows_script(result, "r30", 3)
    assert result.streams["r30"].finish_reason == "stop"


def test_model_kv_exhausted(golden):
    result = run("model_kv_exhausted", golden)
    assert "forward #2: raise KVCacheExhausted (injected)" in result.trace
    assert_model_kv_reaction(result)


def test_recurrent_preempt_chunked_never_shows_garbage(golden):
    result = run("recurrent_preempt_chunked", golden)
    assert "consumed again" not in result.trace
    fed = fed_positions(result)
    for key, chunks in fed.items():
        expected = 0
        for start, rows, fresh in chunks:
            assert fresh == (start == 0)
            assert start in (0, expected), f"s{key} fed at {start}, state expected {expected}"
            expected = start + rows
    assert any(fresh for chunks in fed.values() for (_, _, fresh) in chunks[1:]), (
        "no sequence was preempted and replayed: the scenario lost its point"
    )
    assert all(rows <= 4 for chunks in fed.values() for (_, rows, _) in chunks)
    assert_follows_script(result, "r10", 9)
    assert_follows_script(result, "r20", 8)
    assert_follows_script(result, "r30", 4)


def assert_model_kv_reaction(result: ScenarioResult) -> None:
    """What the engine does when the model itself raises KVCacheExhausted mid-step.

    ``LLMEngine.step`` lets the error out; the driver (here the scenario runner, in production
    ``AsyncEngine``) calls ``fail_in_flight``: every sequence of the failed step finishes with
    "error" and a message naming the cause, keeping the tokens it already streamed, its blocks
    are freed, and a request that was waiting runs normally afterwards.
    """
    for rid in ("r10", "r20"):
        stream = result.streams[rid]
        assert stream.finish_reason == "error", result.trace
        assert stream.error.startswith("KVCacheExhausted: ") and "forward #2" in stream.error
        assert len(stream.token_ids) == 2
        assert_follows_script(result, rid)
    assert "~ running=0 waiting=1 free_blocks=64/64" in result.trace
    assert_follows_script(result, "r30", 4)
    assert result.streams["r30"].finish_reason == "stop"


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_traces_are_deterministic(name):
    assert run_scenario(SCENARIOS[name]).trace == run_scenario(SCENARIOS[name]).trace


def window_blocks(result: ScenarioResult) -> dict[int, list[tuple[list[str], list[str]]]]:
    """Windowed mode: per key, every ``(full, window)`` block table the model was handed."""
    held: dict[int, list[tuple[list[str], list[str]]]] = {}
    for key, full, window in re.findall(r"^blocks s(\d+) full=\[(.*)\] window=\[(.*)\]$", result.trace, re.M):
        held.setdefault(int(key), []).append((full.split(), window.split()))
    return held


def test_window_long_decode(golden):
    """Decoding far past the window: the windowed group never holds more than
    ``ceil(w / bs) + 1`` blocks while the global group holds the whole context, and the pool
    gets the slid-out blocks back."""
    result = run("window_long_decode", golden)
    tables = window_blocks(result)[10]
    assert len(tables) == 1 + 29 and len(tables[-1][0]) == -(-34 // 4)
    for full, window in tables[1:]:
        assert len([b for b in window if b != "-"]) <= -(-WINDOW // 4) + 1, result.trace
        assert "-" not in full
    assert "~ running=1 waiting=0 free_blocks=52/64" in result.trace  # 9 global + 3 window
    assert result.trace.count("free_blocks=64/64") == 1  # all free at the end
    assert_follows_script(result, "r10", 30)


def test_window_preempt_resume(golden):
    """A squeezed pool preempts r20 (admitted last); it waits, then replays its history once r10
    is done (its cached blocks were evicted meanwhile, so from position 0), with the window's
    blocks sliding again; both streams follow their scripts."""
    result = run("window_preempt_resume", golden)
    assert "~ running=1 waiting=1" in result.trace, result.trace
    fed = fed_positions(result)[20]
    replays = [(a, b) for a, b in itertools.pairwise(fed) if b[0] < a[0] + a[1]]
    assert len(replays) == 1, fed
    for rid in ("r10", "r20"):
        assert_follows_script(result, rid, 14)


def test_window_prefix_hit(golden):
    """The same request after the first finished: its prompt's window blocks slid out long ago
    but stay cached, so the hit covers 12 of 13 prompt tokens and reads them back right."""
    result = run("window_prefix_hit", golden)
    assert fed_positions(result)[10][-12] == (12, 1, False), fed_positions(result)[10]
    assert_follows_script(result, "r10", 12)
    assert_follows_script(result, "r10b", 12)
