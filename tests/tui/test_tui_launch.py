"""When ``met serve`` opens the dashboard, the status provider, the log ring and the formatting."""

from __future__ import annotations

import asyncio
import io
import signal
import threading
import types

import pytest

from metrale_core.tui import fmt
from metrale_core.tui.launch import STOP_SIGNALS, StopSignals, follow_host, stop_on_signals, use_dashboard, watch_stop
from metrale_core.tui.logring import LogRing
from metrale_core.tui.status import ServerStatus


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    "no_tui, env, stream, expected",
    [
        (False, {"TERM": "xterm-256color"}, _Tty(), (True, "")),
        (True, {"TERM": "xterm-256color"}, _Tty(), (False, "--no-tui")),
        (False, {"TERM": "xterm", "METRALE_NO_TUI": "1"}, _Tty(), (False, "METRALE_NO_TUI is set")),
        (False, {"TERM": "xterm", "METRALE_NO_TUI": "0"}, _Tty(), (True, "")),
        (False, {"TERM": "xterm"}, io.StringIO(), (False, "stdout is not a terminal")),
        (False, {"TERM": "dumb"}, _Tty(), (False, "TERM is dumb")),
        (False, {}, _Tty(), (False, "TERM is unset")),
    ],
)
def test_use_dashboard(no_tui, env, stream, expected):
    assert use_dashboard(no_tui, stream=stream, env=env) == expected


def test_without_textual_the_server_runs_headless_and_says_how_to_get_the_dashboard(monkeypatch):
    """textual is the ``tui`` extra: a headless install has none, and ``met serve`` on a terminal
    then serves without the dashboard instead of failing."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "textual" else real(name, *a))
    ok, why = use_dashboard(False, stream=_Tty(), env={"TERM": "xterm"})
    assert not ok and "metrale-core[tui]" in why


def test_follow_host_maps_the_server_state():
    engine = types.SimpleNamespace(
        model=types.SimpleNamespace(
            info=types.SimpleNamespace(kv=types.SimpleNamespace(dtype=__import__("torch").float8_e4m3fn))
        ),
        config=types.SimpleNamespace(scheduler="fcfs", kv_cache_dtype=None),
        snapshots=None,
    )
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
        ("<50ms", 1),
        ("<100ms", 1),
        ("<250ms", 0),
        ("<500ms", 0),
        ("<1s", 0),
        ("<2.5s", 0),
        ("≥2.5s", 2),
    ]


def test_sigterm_is_recorded_while_inside_and_the_old_handlers_come_back():
    seen = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    hup = signal.getsignal(signal.SIGHUP)
    try:
        assert STOP_SIGNALS == (signal.SIGTERM,)
        with stop_on_signals() as stop:
            assert stop.received is None and signal.getsignal(signal.SIGHUP) is hup
            signal.raise_signal(signal.SIGTERM)
            signal.raise_signal(signal.SIGTERM)  # a repeat changes nothing
            assert stop.received == signal.SIGTERM and seen == []
        signal.raise_signal(signal.SIGTERM)
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, before)


def test_no_handler_is_installed_off_the_main_thread():
    found = []

    def body():
        with stop_on_signals() as stop:
            found.append((stop, signal.getsignal(signal.SIGTERM)))

    handler = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    ((stop, during),) = found
    assert isinstance(stop, StopSignals) and during is handler


def test_watch_stop_quits_like_the_quit_key_on_a_signal_else_exits_when_the_server_ends():
    calls = []
    app = types.SimpleNamespace(action_quit_server=lambda: calls.append("quit"), exit=lambda: calls.append("exit"))
    alive = [True]
    stop = StopSignals()
    status = ServerStatus(state="serving")
    watch_stop(app, status, server_alive=lambda: alive[0], signals=stop)
    status.poll()
    assert calls == []
    stop.handle(signal.SIGTERM)
    status.poll()
    assert calls == ["quit"]
    calls.clear()
    other = ServerStatus(state="serving")
    watch_stop(app, other, server_alive=lambda: alive[0], signals=StopSignals())
    alive[0] = False
    other.poll()
    assert calls == ["exit"]


def test_sigterm_quits_the_running_dashboard_and_stops_the_server():
    from metrale_core.tui.app import MetraleApp

    stopped = []
    status = ServerStatus(state="serving", listen="127.0.0.1:1")
    status.on_stop(lambda: stopped.append(True))

    async def scenario():
        with stop_on_signals() as stop:
            app = MetraleApp(status, refresh_s=0.05)
            watch_stop(app, status, signals=stop)
            async with app.run_test(size=(100, 30)) as pilot:
                await pilot.pause(0.1)
                assert not app._exit
                signal.raise_signal(signal.SIGTERM)
                deadline = asyncio.get_running_loop().time() + 5
                while not app._exit:
                    assert asyncio.get_running_loop().time() < deadline, "the app did not exit"
                    await pilot.pause(0.05)
        assert app.return_code == 0

    asyncio.run(scenario())
    assert stopped == [True] and status.state == "stopping"
