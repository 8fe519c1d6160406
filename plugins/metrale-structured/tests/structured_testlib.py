"""Helpers of the structured-output end-to-end tests: servers (real uvicorn on loopback, the
installed plugin registry) for the embedded SmolLM2 model and for a random Qwen3 config with the
real Qwen3 tokenizer, and concurrent requests through the official ``openai`` client."""

from __future__ import annotations

import json
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "server"))
sys.path.insert(0, str(ROOT / "plugins" / "metrale-speculative" / "tests"))

from server_testlib import wait_ready  # noqa: E402

QWEN3_TOKENIZER = Path.home() / ".cache" / "metrale" / "tokenizers" / "qwen3"


def smollm2_path() -> Path:
    from metrale_core.loading.embedded import cache_dir

    path = cache_dir() / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        pytest.skip(f"{path} is not cached (run met generate once to fetch it)")
    return path


def qwen3_dir(tmp: Path) -> Path:
    """A random 2-layer Qwen3 checkpoint with the real Qwen3 tokenizer (vocab 151,936 rows,
    151,669 tokenizer ids: the tail is model padding)."""
    if not (QWEN3_TOKENIZER / "tokenizer.json").is_file():
        pytest.skip("the Qwen3 tokenizer is not fetched (bash scripts/fetch-test-data.sh)")
    from spec_harness import write_qwen3

    write_qwen3(tmp, seed=3, vocab=151936, hidden=32)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(QWEN3_TOKENIZER / name, tmp / name)
    cfg = json.loads((tmp / "config.json").read_text())
    cfg["eos_token_id"] = 151645
    (tmp / "config.json").write_text(json.dumps(cfg))
    return tmp


def start(path: Path, *, registry=None, model_type: str, name: str = "m", engine=None, **server_options):
    """A running server for the checkpoint at ``path``; returns ``(server, host)``."""
    from metrale_core.engine import EngineConfig, LLMEngine
    from metrale_core.loading.load import load_model
    from metrale_core.plugin.discovery import load_registry
    from metrale_core.server import ServedModel, ServerConfig, create_app, serve_in_thread

    registry = registry if registry is not None else load_registry()

    def load():
        loaded = load_model(path, progress=False)
        cfg = dict(kv_cache_memory=256 << 20, max_num_seqs=16)
        cfg.update(engine or {})
        eng = LLMEngine(loaded.model, EngineConfig(**cfg), tokenizer=loaded.tokenizer, registry=registry)
        return ServedModel(engine=eng, tokenizer=loaded.tokenizer, model_type=model_type)

    app = create_app(ServerConfig(served_model_name=name, **server_options), load, registry)
    server = serve_in_thread(app)
    wait_ready(server.url, timeout=300)
    return server, app.state.host


def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=600)


def chat_text(c, *, stream: bool, **kwargs) -> tuple[str, str]:
    """``(content, finish_reason)`` of one chat completion, streamed or whole."""
    if not stream:
        resp = c.chat.completions.create(model="m", **kwargs)
        return resp.choices[0].message.content or "", resp.choices[0].finish_reason
    parts, finish = [], None
    for chunk in c.chat.completions.create(model="m", stream=True, **kwargs):
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    return "".join(parts), finish


def concurrently(fn, items, workers: int = 16) -> list:
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, items))
