"""When ``met serve`` opens the dashboard, the status provider, the log ring and the formatting."""

from __future__ import annotations

import io
import types

import pytest

from metrale_core.tui import fmt
from metrale_core.tui.launch import follow_host, use_dashboard
from metrale_core.tui.logring import LogRing
from metrale_core.tui.status import ServerStatus


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("no_tui, env, stream, expected", [
    (False, {"TERM": "xterm-256color"}, _Tty(), (True, "")),
    (True, {"TERM": "xterm-256color"}, _Tty(), (False, "--no-tui")),
    (False, {"TERM": "xterm", "METRALE_NO_TUI": "1"}, _Tty(), (False, "METRALE_NO_TUI is set")),
    (False, {"TERM": "xterm", "METRALE_NO_TUI": "0"}, _Tty(), (True, "")),
    (False, {"TERM": "xterm"}, io.StringIO(), (False, "stdout is not a terminal")),
    (False, {"TERM": "dumb"}, _Tty(), (False, "TERM is dumb")),
    (False, {}, _Tty(), (False, "TERM is unset")),
])
def test_use_dashboard(no_tui, env, stream, expected):
    assert use_dashboard(no_tui, stream=stream, env=env) == expected


def test_follow_host_maps_the_server_state():
    engine = types.SimpleNamespace(
        model=types.SimpleNamespace(info=types.SimpleNamespace(kv=types.SimpleNamespace(
            dtype=__import__("torch").float8_e4m3fn))),
        config=types.SimpleNamespace(scheduler="fcfs", kv_cache_dtype=None), snapshots=None)
    host = types.SimpleNamespace(status="loading", served=None, error=None)
    status = ServerStatus()
    follow_host(status, host)
    status.poll()
    assert status.pill == "LOADING" and status.engine is None
    host.status, host.served = "ready", types.SimpleNamespace(engine=engine)
    status.poll()
    assert status.pill == "SERVING" and status.engine is engine and status.ready_at is not None
    assert status.kv_dtype == "float8_e4m3fn" and status.scheduler == "fcfs"
    host.status = "stopping"
    status.poll()
    assert status.pill == "STOPPING"

    failed = ServerStatus()
    follow_host(failed, types.SimpleNamespace(status="failed", served=None, error="boom"))
    failed.poll()
    assert failed.pill == "FAILED" and failed.error == "boom"


def test_stop_callback_runs_once_even_when_registered_after_the_quit():
    calls = []
    status = ServerStatus()
    status.request_stop()
    status.request_stop()
    status.on_stop(lambda: calls.append("stop"))
    assert calls == ["stop"] and status.state == "stopping"
    later = ServerStatus(state="serving")
    later.on_stop(lambda: calls.append("later"))
    later.request_stop()
    later.request_stop()
    assert calls == ["stop", "later"]


def test_phases_and_load_progress():
    now = [100.0]
    status = ServerStatus(clock=lambda: now[0])
    status.plan_phases("weights", "engine")
    with status.phase("weights"):
        status.start_load(checkpoint_bytes=1000)
        now[0] += 2.0
        status.tensor_loaded(1, 4, 300)
        assert status.load.eta() == pytest.approx(6.0) and status.load.rate() == 150.0
    with pytest.raises(RuntimeError):
        with status.phase("engine"):
            raise RuntimeError("no memory")
    weights, engine = status.phases
    assert weights.state == "done" and weights.elapsed(now[0]) == 2.0
    assert engine.state == "failed" and engine.detail == "RuntimeError: no memory"
    assert ServerStatus(listen="0.0.0.0:8000").base_url == "http://127.0.0.1:8000"


def test_log_ring_is_bounded_and_sequenced():
    ring = LogRing(capacity=3)
    for i in range(5):
        ring.append("INFO", f"line {i}")
    assert [r.message for r in ring.all()] == ["line 2", "line 3", "line 4"]
    assert [r.seq for r in ring.since(4)] == [5] and ring.since(5) == []
    assert ring.all()[0].matches("LINE 2") and not ring.all()[0].matches("line 3")


def test_formatting():
    assert fmt.uptime(65) == "up 0:01:05" and fmt.uptime(90061) == "up 1d 01:01"
    assert fmt.human_bytes(1_500_000) == "1.5 MB" and fmt.human_bytes(12) == "12 B"
    assert fmt.bar(0.5, 4) == "██░░" and fmt.sparkline([0, 1, 2], 5) == "  ▁▅█"
    assert fmt.histogram([0.01, 0.07, 3.0, 9.0]) == [
        ("<50ms", 1), ("<100ms", 1), ("<250ms", 0), ("<500ms", 0), ("<1s", 0), ("<2.5s", 0),
        ("≥2.5s", 2)]
