"""``met generate --model ORG/NAME`` for an HF repo (safetensors + config + tokenizer): only the files
the loader reads are fetched, and the answer is the one the same checkpoint gives from a local path."""

from __future__ import annotations

import pytest

from tests.hub.test_hub_cli import met
from tests.server.server_testlib import write_tokenizer


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    import torch
    import transformers

    from metrale_core.text.tokenizer import Tokenizer

    path = tmp_path_factory.mktemp("tiny-qwen3")
    write_tokenizer(path)
    config = transformers.Qwen3Config(
        vocab_size=Tokenizer.from_dir(path).vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(config).save_pretrained(path, safe_serialization=True)
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
