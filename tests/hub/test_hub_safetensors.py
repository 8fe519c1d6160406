"""``met generate --model ORG/NAME`` for an HF repo (safetensors + config + tokenizer): only the files
the loader reads are fetched, and the answer is the one the same checkpoint gives from a local path."""

from __future__ import annotations

import pytest

from metrale_core.testing.random_checkpoint import write_random_checkpoint
from tests.hub.test_hub_cli import met


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-qwen3")
    write_random_checkpoint(path, max_position_embeddings=256)
    return path


def test_generate_by_hub_name_matches_local(hub, tiny_checkpoint):
    files = {p.name: p.read_bytes() for p in tiny_checkpoint.iterdir() if p.is_file()}
    hub.repos["org/tiny-qwen3"] = {**files, "pytorch_model.bin": b"not fetched", "README.md": b"# tiny"}
    argv = ("generate", "Hello", "--max-tokens", "6", "--temperature", "0", "--ignore-eos")
    by_name = met(*argv, "--model", "org/tiny-qwen3")
    assert by_name.returncode == 0, by_name.stderr
    local = met(*argv, "--model", str(tiny_checkpoint))
    assert local.returncode == 0, local.stderr
    assert by_name.stdout == local.stdout and by_name.stdout.strip()
    fetched = {path.rsplit("/", 1)[-1] for method, path, _ in hub.requests if method == "GET" and "/resolve/" in path}
    assert "model.safetensors" in fetched and "config.json" in fetched and "tokenizer.json" in fetched
    assert "pytorch_model.bin" not in fetched and "README.md" not in fetched, fetched
