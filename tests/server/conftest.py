"""Fixtures: one real uvicorn server on loopback serving the scripted model (session-scoped),
an official ``openai`` client pointed at it, and a factory for servers with other options."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from server_testlib import ScriptedLM, wait_ready, write_tokenizer


@pytest.fixture(scope="session")
def byte_tokenizer(tmp_path_factory):
    from metrale_core.tokenizer import Tokenizer

    return Tokenizer.from_dir(write_tokenizer(tmp_path_factory.mktemp("bytetok")))


@pytest.fixture(scope="session")
def start_server(byte_tokenizer):
    """``start_server(**options) -> (RunningServer, EngineHost)``; all are stopped at the end."""
    from metrale_core.engine import EngineConfig, LLMEngine
    from metrale_core.plugins import load_registry
    from metrale_core.server import ServedModel, ServerConfig, create_app, serve_in_thread

    registry = load_registry()
    running = []

    def start(*, engine_options=None, loader=None, registry=registry, **options):
        config = ServerConfig(**{"served_model_name": "scripted", **options})

        def load():
            cfg = dict(block_size=16, num_kv_blocks=512, max_num_seqs=32, max_prefill_tokens=2048)
            cfg.update(engine_options or {})
            engine = LLMEngine(ScriptedLM(byte_tokenizer), EngineConfig(**cfg),
                               tokenizer=byte_tokenizer, registry=registry)
            return ServedModel(engine=engine, tokenizer=byte_tokenizer, model_type="qwen3")

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
