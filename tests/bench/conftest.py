"""Fixtures for the ``met bench`` tests: the server tests' ``start_server`` (a real uvicorn on
loopback serving the scripted model), reused from ``tests/server/conftest.py`` rather than copied,
and a tiny random GGUF for ``met bench engine``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("server_conftest", Path(__file__).parents[1] / "server" / "conftest.py")
assert _spec is not None and _spec.loader is not None
_server = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_server)

byte_tokenizer_dir = _server.byte_tokenizer_dir
byte_tokenizer = _server.byte_tokenizer
start_server = _server.start_server


@pytest.fixture(scope="session")
def random_gguf(tmp_path_factory) -> Path:
    """A random 2-layer Qwen2 GGUF with a byte vocabulary (context 256)."""
    from metrale_core.testing.random_gguf import write_random_qwen2_gguf

    path = tmp_path_factory.mktemp("bench-gguf") / "tiny-qwen2.gguf"
    write_random_qwen2_gguf(path)
    return path
