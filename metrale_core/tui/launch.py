"""Whether and how ``met serve`` runs the dashboard, and its glue to the server.

Owner: ``metrale_core.cli.serve`` (the only caller besides tests).

Invariants:
- :func:`use_dashboard` says no (with the reason) for ``--no-tui``, ``METRALE_NO_TUI=1``, a
  stdout that is not a TTY, and an unset or ``dumb`` TERM; then ``met serve`` logs plainly.
- While the dashboard runs, loguru writes into a :class:`LogRing` instead of stderr (a TTY the
  dashboard owns); :func:`dashboard_logging` restores the stderr sink afterwards.
- :func:`follow_host` maps the server's ``EngineHost`` state (loading / ready / failed /
  stopping) onto :class:`ServerStatus` on every dashboard poll; it only reads the host.
- :func:`run_dashboard` returns after the user quit or a stop signal arrived (the server's stop
  callback already ran) or after the server stopped on its own (the app exits when
  ``server_alive()`` turns False).
- While :func:`serve_with_dashboard` runs (in the main thread), SIGTERM does what quitting
  does: the handler only records the signal (:class:`StopSignals`, one assignment, so it is
  safe wherever the main thread is interrupted); the dashboard's next poll calls
  :meth:`ServerStatus.request_stop` and exits, uvicorn stops gracefully (in-flight requests get
  the grace period), the engine stops, the terminal is restored and the call returns 0.  A
  repeated signal while the server stops changes nothing.  The previous handlers are put back
  when the call returns; off the main thread no handler is installed.
- SIGHUP keeps its default (the process ends at once): on a real hang-up the kernel also sends
  SIGCONT, Textual's handler for it "resumes" onto the dead terminal and its shutdown then
  blocks on output forever, so a graceful SIGHUP would leave the process hanging.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TextIO

from loguru import logger

from metrale_core.tui.logring import LogRing
from metrale_core.tui.status import ServerStatus

__all__ = [
    "PHASES",
    "STOP_SIGNALS",
    "StopSignals",
    "dashboard_logging",
    "follow_host",
    "observe_loader",
    "run_dashboard",
    "serve_with_dashboard",
    "stop_on_signals",
    "use_dashboard",
    "watch_stop",
]

#: The start-up checklist of ``met serve``.
PHASES = ("HTTP server", "load model", "start engine")

#: Signals that stop ``met serve`` the way quitting the dashboard does (not SIGHUP: see above).
STOP_SIGNALS = (signal.SIGTERM,)

_HOST_STATES = {"loading": "loading", "ready": "serving", "failed": "failed", "stopping": "stopping"}


def use_dashboard(
    no_tui: bool = False, stream: TextIO | None = None, env: Mapping[str, str] | None = None
) -> tuple[bool, str]:
    """``(True, "")`` when the dashboard should run, else ``(False, why not)``."""
    env = os.environ if env is None else env
    stream = sys.stdout if stream is None else stream
    if no_tui:
        return False, "--no-tui"
    if importlib.util.find_spec("textual") is None:
        return False, "textual is not installed (pip install 'metrale-core[tui]' for the dashboard)"
    if env.get("METRALE_NO_TUI", "").strip() not in ("", "0"):
        return False, "METRALE_NO_TUI is set"
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    if not tty:
        return False, "stdout is not a terminal"
    term = env.get("TERM", "")
    if not term or term == "dumb":
        return False, f"TERM is {term or 'unset'}"
    return True, ""


def dashboard_logging(ring: LogRing, level: str) -> AbstractContextManager[None]:
    """Route loguru to ``ring`` for the duration (the stderr sink is put back after)."""
    from metrale_core.logs import routed_to

    return routed_to(ring.sink, level)


def follow_host(status: ServerStatus, host: Any) -> None:
    """Keep ``status`` in step with the server's ``EngineHost`` (read on every poll)."""

    def sync(s: ServerStatus) -> None:
        state = _HOST_STATES.get(host.status, s.state)
        served = host.served
        if served is not None and s.engine is None:
            # data parallel: the replicas' snapshots in one (the server's own engine never runs)
            s.engine = host.async_engine if getattr(host, "replicated", False) else served.engine
            if s.kv_dtype is None:
                wanted = getattr(served.engine.config, "kv_cache_dtype", None)
                kv = served.engine.model.info.kv
                s.kv_dtype = wanted or (str(kv.dtype).removeprefix("torch.") if kv is not None else "none")
            if s.scheduler is None:
                s.scheduler = served.engine.config.scheduler
        if state == "serving" and any(p.name == "start engine" and p.state == "running" for p in s.phases):
            s.end_phase("start engine")
        if state == "failed" and s.state != "failed":
            s.set_failed(host.error or "the model failed to load")
        elif state == "serving" and s.state == "loading":
            s.set_serving()
        elif state != s.state and state in ("loading", "stopping") and s.state != "failed":
            s.state = state

    status.add_poll_hook(sync)


class StopSignals:
    """The stop signal received so far; its handler does nothing but record the first one."""

    def __init__(self) -> None:
        self.received: int | None = None

    def handle(self, signum: int, frame: Any = None) -> None:
        # Runs in the main thread wherever it was interrupted (maybe inside a lock it holds):
        # one assignment, nothing else; the dashboard's poll acts on it.
        if self.received is None:
            self.received = signum


@contextmanager
def stop_on_signals(signals: tuple[int, ...] = STOP_SIGNALS) -> Iterator[StopSignals]:
    """Record ``signals`` in a :class:`StopSignals` for the duration (main thread only; else
    nothing is installed), then put the previous handlers back."""
    stop = StopSignals()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {}
    try:
        for sig in signals:
            previous[sig] = signal.signal(sig, stop.handle)
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def watch_stop(
    app: Any, status: ServerStatus, server_alive: Callable[[], bool] | None = None, signals: StopSignals | None = None
) -> None:
    """On every poll: quit ``app`` as its quit key does once a stop signal arrived, or just exit
    it once the server stopped on its own."""

    def watch(s: ServerStatus) -> None:
        if signals is not None and signals.received is not None:
            if not s.stop_requested:
                logger.info("{}: stopping the server", signal.Signals(signals.received).name)
            app.action_quit_server()
        elif server_alive is not None and not server_alive():
            app.exit()

    status.add_poll_hook(watch)


def run_dashboard(
    status: ServerStatus,
    logs: LogRing,
    server_alive: Callable[[], bool] | None = None,
    refresh_s: float = 0.5,
    signals: StopSignals | None = None,
) -> None:
    """Run the dashboard in this (the main) thread until the user quits, a stop signal arrives
    (``signals``) or the server stops."""
    from metrale_core.tui.app import MetraleApp

    app = MetraleApp(status, logs, refresh_s=refresh_s)
    watch_stop(app, status, server_alive, signals)
    app.run()


def observe_loader(status: ServerStatus, loader: Callable[[], Any]) -> Callable[[], Any]:
    """Wrap the server's model loader so the checklist shows "load model" / "start engine".

    Weight progress comes from ``load_model(..., on_tensor=status.tensor_loaded)`` inside it.
    """

    def load() -> Any:
        status.start_load()
        with status.phase("load model"):
            served = loader()
        status.begin_phase("start engine")
        return served

    return load


def serve_with_dashboard(
    app: Any,
    status: ServerStatus,
    *,
    host: str,
    port: int,
    grace_s: float,
    log_level: str = "info",
    refresh_s: float = 0.5,
) -> int:
    """Serve ``app`` (the server's ASGI app) on a thread with the dashboard in this thread.

    Quitting the dashboard or SIGTERM stop uvicorn gracefully (in-flight requests get
    ``grace_s``), whose lifespan then stops the engine; the call returns once the server thread
    has ended.
    """
    from metrale_core.server import serve_in_thread

    logs = LogRing()
    if not status.phases:
        status.plan_phases(*PHASES)
    with stop_on_signals() as signals, dashboard_logging(logs, log_level):
        with status.phase("HTTP server"):
            server = serve_in_thread(app, host=host, port=port, grace_s=grace_s)
        status.listen = f"{host}:{server.port}"
        status.end_phase("HTTP server", detail=status.listen)
        logger.info("listening on http://{}:{}", host, server.port)
        follow_host(status, app.state.host)
        status.on_stop(lambda: setattr(server.server, "should_exit", True))
        try:
            run_dashboard(status, logs, server_alive=server.thread.is_alive, refresh_s=refresh_s, signals=signals)
        finally:
            status.request_stop()
            server.stop(timeout=grace_s + 30)
    return 0
