"""Run the app under uvicorn: in the foreground (``met serve``) or on a thread (tests, benchmarks).

Owner: ``metrale_core.cli.serve`` calls :func:`serve_forever`; tests and ``bench/bench_http.py``
call :func:`serve_in_thread`.

Invariants:
- uvicorn's own access log is off (the app logs each request through loguru).  On
  SIGINT/SIGTERM the server stops accepting connections, then the app's ``EngineHost.drain``
  gives in-flight requests the grace period and aborts the rest, so every stream ends with an
  error event and ``data: [DONE]`` rather than being cut off; only then does uvicorn close
  connections (cancelling anything still left after a few more seconds) and the app's lifespan
  stop the engine.
- :func:`serve_forever` ends a SIGINT with ``KeyboardInterrupt`` every time (``met`` prints
  "met: interrupted" and exits 130), whether or not uvicorn's own re-raise of the signal got
  through asyncio's SIGINT handler.
- :func:`serve_in_thread` binds the socket itself before starting (port 0 picks a free port), so
  ``RunningServer.url`` is right as soon as it returns; it returns once the server accepts
  connections.
"""

from __future__ import annotations

import signal
import socket
import threading
import time

import uvicorn
from attrs import define

__all__ = ["RunningServer", "serve_forever", "serve_in_thread", "uvicorn_config"]


def uvicorn_config(app, host: str, port: int, grace_s: float) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="on",
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=5,
        timeout_keep_alive=5,
    )


class _Server(uvicorn.Server):
    """uvicorn, draining the app's in-flight requests before connections are closed."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        #: The signals that stopped (or are stopping) the server, in order.
        self.signals_received: list[int] = []

    def handle_exit(self, sig: int, frame) -> None:
        self.signals_received.append(sig)
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets=None) -> None:
        for server in self.servers:
            server.close()
        state = getattr(self.config.app, "state", None)
        host = getattr(state, "host", None) if state is not None else None
        if host is not None and hasattr(host, "drain"):
            await host.drain()
        await super().shutdown(sockets)


def serve_forever(app, host: str, port: int, grace_s: float) -> None:
    """Serve until SIGINT/SIGTERM (blocking); a SIGINT ends in ``KeyboardInterrupt``."""
    server = _Server(uvicorn_config(app, host, port, grace_s))
    server.run()
    if signal.SIGINT in server.signals_received:
        # uvicorn re-raises the signal after its shutdown, but when asyncio's own SIGINT handler
        # sees it after the serve task finished the re-raise can be lost (exit 0, no message)
        raise KeyboardInterrupt


@define
class RunningServer:
    """A uvicorn server on a background thread."""

    server: uvicorn.Server
    thread: threading.Thread
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout: float = 30.0) -> None:
        """Graceful stop (as on SIGTERM), then join the thread."""
        self.server.should_exit = True
        self.thread.join(timeout)


def serve_in_thread(
    app, host: str = "127.0.0.1", port: int = 0, grace_s: float = 5.0, startup_timeout: float = 30.0
) -> RunningServer:
    """Start ``app`` on ``host:port`` in a daemon thread; returns when it accepts connections."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    port = sock.getsockname()[1]
    server = _Server(uvicorn_config(app, host, port, grace_s))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="metrale-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the server on {host}:{port} did not start")
        time.sleep(0.01)
    return RunningServer(server=server, thread=thread, host=host, port=port)
