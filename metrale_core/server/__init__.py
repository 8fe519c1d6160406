"""The OpenAI-compatible HTTP server (Litestar + uvicorn) behind ``met serve``.

Public API: :func:`create_app` (the ASGI app), :class:`ServerConfig` (server options),
:class:`ServedModel` (what a loader returns), :func:`serve_in_thread` (a real uvicorn server on
loopback for tests and benchmarks).  Everything else here may change without notice.
"""

from __future__ import annotations

from metrale_core.server.app import create_app
from metrale_core.server.host import EngineHost, ServedModel, ServerConfig
from metrale_core.server.runner import RunningServer, serve_in_thread

__all__ = ["EngineHost", "RunningServer", "ServedModel", "ServerConfig", "create_app", "serve_in_thread"]
