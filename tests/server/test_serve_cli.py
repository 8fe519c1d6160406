"""``met serve`` as a real process on a tiny random Qwen3 checkpoint (the real loading path:
weight store, loader plugin, tokenizer from the directory), ``met chat`` against it, and a clean
exit on SIGINT."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest
import transformers
from server_testlib import API_KEY, wait_ready, write_tokenizer


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory):
    import torch

    path = tmp_path_factory.mktemp("tiny-qwen3")
    write_tokenizer(path)
    from metrale_core.tokenizer import Tokenizer

    vocab = Tokenizer.from_dir(path).vocab_size
    config = transformers.Qwen3Config(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=512,
        tie_word_embeddings=True)
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(config).save_pretrained(path)
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def met_serve(tiny_qwen3, tmp_path_factory):
    port = _free_port()
    log = open(tmp_path_factory.mktemp("serve-log") / "stderr.txt", "w+")  # noqa: SIM115 -- closed after the yield
    env = {**os.environ, "METRALE_API_KEY": API_KEY}
    proc = subprocess.Popen(
        [sys.executable, "-m", "metrale_core", "serve", str(tiny_qwen3), "--port", str(port),
         "--served-model-name", "tiny", "--kv-cache-memory", "8M", "--shutdown-grace", "2"],
        env=env, stdout=subprocess.DEVNULL, stderr=log, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(url + "/health/live")
            break
        except httpx.HTTPError:
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise AssertionError(f"met serve did not start: {log.read()}") from None
            time.sleep(0.1)
    wait_ready(url, timeout=60)
    proc.log = log
    yield proc, url
    log.close()
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_met_serve_answers_the_openai_client(met_serve):
    _, url = met_serve
    client = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)
    assert [m.id for m in client.models.list().data] == ["tiny"]
    resp = client.completions.create(model="tiny", prompt="hello", max_tokens=6, temperature=0)
    assert resp.usage.completion_tokens == 6 and resp.choices[0].finish_reason == "length"
    chat = client.chat.completions.create(model="tiny", max_tokens=4, temperature=0,
                                          messages=[{"role": "user", "content": "hi"}])
    assert chat.usage.completion_tokens <= 4
    assert httpx.get(url + "/v1/models").status_code == 401  # METRALE_API_KEY is honoured
    metrics = httpx.get(url + "/metrics").text
    assert 'metrale:generation_tokens_total{model_name="tiny"}' in metrics


def test_met_chat_streams_a_reply(met_serve):
    _, url = met_serve
    client = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)
    expected = client.chat.completions.create(
        model="tiny", max_tokens=3, temperature=0,
        messages=[{"role": "user", "content": "hi"}]).choices[0].message.content
    out = subprocess.run(
        [sys.executable, "-m", "metrale_core", "chat", "--url", url, "--api-key", API_KEY,
         "-p", "hi", "--max-tokens", "3", "--temperature", "0"],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == expected + "\n"  # the streamed reply, then one newline
    bad = subprocess.run(
        [sys.executable, "-m", "metrale_core", "chat", "--url", url, "-p", "hi"],
        capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "HTTP 401" in bad.stderr


def test_met_serve_exits_cleanly_on_sigint(met_serve):
    proc, url = met_serve
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) in (0, 130)  # uvicorn re-raises SIGINT after its shutdown
    proc.log.seek(0)
    stderr = proc.log.read()
    assert "Traceback" not in stderr and "met: interrupted" in stderr
    with pytest.raises(httpx.HTTPError):
        httpx.get(url + "/health", timeout=2)
