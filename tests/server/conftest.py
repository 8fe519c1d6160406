"""Fixtures: one real uvicorn server on loopback serving the scripted model (session-scoped),
an official ``openai`` client pointed at it, and a factory for servers with other options."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from server_testlib import scripted_served, wait_ready, write_tokenizer


@pytest.fixture(scope="session")
def byte_tokenizer_dir(tmp_path_factory):
    return write_tokenizer(tmp_path_factory.mktemp("bytetok"))


@pytest.fixture(scope="session")
def byte_tokenizer(byte_tokenizer_dir):
    from metrale_core.text.tokenizer import Tokenizer

    return Tokenizer.from_dir(byte_tokenizer_dir)


@pytest.fixture(scope="session")
def start_server(byte_tokenizer):
    """``start_server(**options) -> (RunningServer, EngineHost)``; all are stopped at the end."""
    from metrale_core.plugin.discovery import load_registry
    from metrale_core.server import ServerConfig, create_app, serve_in_thread

    registry = load_registry()
    running = []

    def start(*, engine_options=None, loader=None, registry=registry, **options):
        config = ServerConfig(**{"served_model_name": "scripted", **options})

        def load():
            return scripted_served(byte_tokenizer, engine_options, registry)

        app = create_app(config, loader or load, registry)
        server = serve_in_thread(app)
        host = app.state.host
        running.append(server)
        wait_ready(server.url, timeout=120)  # real models load slowly on a busy machine
        return server, host

    yield start
    for server in running:
        server.stop()


@pytest.fixture(scope="session")
def server(start_server):
    """The shared server (no API key)."""
    return start_server()


@pytest.fixture(scope="session")
def base_url(server):
    return server[0].url


@pytest.fixture(scope="session")
def client(base_url):
    import openai

    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory):
    """A tiny random Qwen3 checkpoint with the byte tokenizer (for `met serve` as a process)."""
    from metrale_core.testing.random_checkpoint import write_random_checkpoint

    path = tmp_path_factory.mktemp("tiny-qwen3")
    write_random_checkpoint(path)
    return path
