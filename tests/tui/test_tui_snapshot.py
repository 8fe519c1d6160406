"""The engine's published ``EngineSnapshot``: counters, TTFT, KV usage, preemptions, prefix-cache
stats and plugin extras, read from another thread while the engine runs."""

from __future__ import annotations

import threading

from metrale_core.engine.snapshot import EngineSnapshot, percentile
from metrale_core.sampling.params import SamplingParams
from metrale_core.testing import FakeClock, RecordingModel, SeqScript


def _engine(tiny_engine, scripts, **config):
    return tiny_engine(RecordingModel(scripts), **config)


def test_counters_ttft_and_pools_follow_the_steps(tiny_engine, fake_clock: FakeClock):
    scripts = [
        SeqScript(prompt=[10, 11, 12, 13, 14], output=[20, 21, 22]),
        SeqScript(prompt=[30, 31], output=[40, 41, 42]),
    ]
    engine = _engine(tiny_engine, scripts)
    first = engine.snapshots.latest
    assert first.step == 0 and first.requests_total == 0 and first.num_free_blocks == 64
    engine.add_request("a", [10, 11, 12, 13, 14], SamplingParams(max_tokens=3))
    fake_clock.advance(0.25)
    engine.add_request("b", [30, 31], SamplingParams(max_tokens=3))
    queued = engine.snapshots.latest
    assert queued.requests_total == 2 and queued.num_waiting == 2 and queued is not first
    fake_clock.advance(0.5)
    engine.step()  # both prefill and sample their first token
    snap = engine.snapshots.latest
    assert snap.step == 1 and snap.prompt_tokens_total == 7 and snap.generation_tokens_total == 2
    assert snap.ttft_samples == (0.75, 0.5) and snap.ttft_count == 2
    assert snap.num_running == 2 and snap.num_used_blocks == 3  # 5+1 tokens -> 2, 2+1 -> 1
    assert snap.prefix_cache_queries == 7 and snap.prefix_cache_hit_rate == 0.0
    while engine.has_unfinished():
        engine.step()
    done = engine.snapshots.latest
    assert done.generation_tokens_total == 6 and done.prompt_tokens_total == 7
    assert done.requests_finished == 2 and dict(done.finish_reasons) == {"length": 2}
    assert done.num_running == 0 and done.num_free_blocks == 64 and done.ttft_count == 2
    assert snap.generation_tokens_total == 2  # an old snapshot never changes


def test_abort_before_first_token_records_no_ttft(tiny_engine):
    engine = _engine(tiny_engine, [SeqScript(prompt=[5, 6], output=[7])])
    engine.add_request("x", [5, 6], SamplingParams(max_tokens=4))
    engine.abort("x")
    engine.step()
    snap = engine.snapshots.latest
    assert snap.ttft_count == 0 and dict(snap.finish_reasons) == {"abort": 1}


def test_preemptions_and_extras_are_published(tiny_engine):
    scripts = [SeqScript(prompt=[k, k + 1, k + 2, k + 3], output=[30 + k] * 8) for k in (1, 20)]
    engine = _engine(tiny_engine, scripts, num_kv_blocks=4)
    engine.snapshots.set_extra("fp8_scale_source", "checkpoint")
    calls = []
    engine.snapshots.add_extras_provider("b1_count", lambda: len(calls))
    engine.snapshots.add_extras_provider("broken", lambda: 1 / 0)
    for key in (1, 20):
        engine.add_request(f"r{key}", [key, key + 1, key + 2, key + 3], SamplingParams(max_tokens=8))
    while engine.has_unfinished():
        calls.append(1)
        engine.step()
    snap = engine.snapshots.latest
    assert snap.num_preemptions > 0 and snap.num_preemptions == engine.scheduler.num_preemptions
    assert snap.extras["fp8_scale_source"] == "checkpoint"
    assert snap.extras["b1_count"] == len(calls) and "broken" not in snap.extras
    assert snap.generation_tokens_total == 16


def test_a_reader_thread_sees_only_whole_snapshots(tiny_engine):
    scripts = [SeqScript(prompt=[k, k + 1], output=list(range(40, 52))) for k in range(1, 9)]
    engine = _engine(tiny_engine, scripts)
    seen: list[EngineSnapshot] = []
    stop = threading.Event()

    def read():
        while not stop.is_set():
            seen.append(engine.snapshots.latest)

    reader = threading.Thread(target=read)
    reader.start()
    for k in range(1, 9):
        engine.add_request(f"q{k}", [k, k + 1], SamplingParams(max_tokens=12))
    while engine.has_unfinished():
        engine.step()
    stop.set()
    reader.join()
    for snap in seen:  # each snapshot is internally consistent
        assert snap.num_free_blocks + snap.num_used_blocks == snap.num_blocks
        assert snap.requests_finished <= snap.requests_total
    steps = [s.step for s in seen]
    assert steps == sorted(steps) and engine.snapshots.latest.generation_tokens_total == 96


def test_percentile_is_nearest_rank():
    assert percentile([], 50) is None
    assert percentile([0.3, 0.1, 0.2], 50) == 0.2
    assert percentile([float(i) for i in range(1, 11)], 90) == 9.0
    assert percentile([1.0], 90) == 1.0


def test_each_extra_carries_the_label_and_format_its_plugin_declared(tiny_engine):
    """The core knows no extra by name: a plugin declares how its value reads."""
    engine = _engine(tiny_engine, [SeqScript(prompt=[5, 6], output=[7])])
    pub = engine.snapshots
    pub.add_extras_provider("my_rate", lambda: 0.25, label="My rate", format=lambda v: f"{100 * v:.0f}%")
    pub.set_extra("plain", 3)
    pub.add_extras_provider("my_rate", lambda: 0.5)  # no label: the declared one is kept
    engine.add_request("x", [5, 6], SamplingParams(max_tokens=1))
    engine.step()
    snap = engine.snapshots.latest
    assert snap.extras == {"my_rate": 0.5, "plain": 3}
    assert snap.describe_extras() == [("plain", "3"), ("My rate", "50%")]
    pub.set_extra("plain", 4, label="Plain")
    engine.add_request("y", [5, 6], SamplingParams(max_tokens=1))
    engine.step()
    assert ("Plain", "4") in engine.snapshots.latest.describe_extras()
    assert snap.describe_extras()[0] == ("plain", "3")  # an old snapshot keeps its formats
