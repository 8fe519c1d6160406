"""Fixtures for the dashboard tests: a tiny random Llama checkpoint and a real server on it
(uvicorn on a free loopback port) with its ``ServerStatus`` wired the way ``met serve`` does."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tui_testlib import build_tiny_llama, make_loader


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def served(tiny_llama):
    """A real server (uvicorn on a free loopback port) on the tiny Llama, and its ServerStatus
    wired the way ``met serve`` wires it; the server is stopped at the end."""
    import time

    import httpx

    from metrale_core.plugin.discovery import load_registry
    from metrale_core.server import ServerConfig, create_app, serve_in_thread
    from metrale_core.tui.launch import follow_host
    from metrale_core.tui.status import ServerStatus

    registry = load_registry()
    status = ServerStatus(model="tiny-llama")
    status.plan_phases("HTTP server", "weights", "engine")
    app = create_app(ServerConfig(served_model_name="tiny-llama"), make_loader(status, tiny_llama, registry), registry)
    with status.phase("HTTP server"):
        server = serve_in_thread(app)
    status.listen = f"{server.host}:{server.port}"
    follow_host(status, app.state.host)
    status.on_stop(lambda: setattr(server.server, "should_exit", True))
    deadline = time.monotonic() + 30
    while httpx.get(server.url + "/health").status_code != 200:
        assert time.monotonic() < deadline, "the tiny server never became healthy"
        time.sleep(0.02)
    status.poll()
    assert status.state == "serving" and status.engine is not None
    yield status, server
    server.stop()
