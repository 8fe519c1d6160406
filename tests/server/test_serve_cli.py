"""``met serve`` as a real process on a tiny random Qwen3 checkpoint (the real loading path:
weight store, loader plugin, tokenizer from the directory), ``met chat`` against it, and a clean
exit on SIGINT."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import httpx
import openai
import pytest
from server_testlib import API_KEY, wait_started

from metrale_core.testing.serve_argv import serve_argv


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(model, log, *flags: str):
    """``met serve MODEL FLAGS`` as a process: ``(Popen, url)`` once ``/health`` is 200."""
    port = _free_port()
    env = {**os.environ, "METRALE_API_KEY": API_KEY}
    proc = subprocess.Popen(
        serve_argv(model, port, "tiny", "--kv-cache-memory", "8M", "--shutdown-grace", "2", *flags, no_tui=False),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"

    def read_log() -> str:
        log.seek(0)
        return log.read()

    wait_started(proc, url, read_log, live_timeout=60, ready_timeout=120)
    proc.log = log
    return proc, url


@pytest.fixture(scope="module")
def met_serve(tiny_qwen3, tmp_path_factory):
    with open(tmp_path_factory.mktemp("serve-log") / "stderr.txt", "w+") as log:
        proc, url = _start(tiny_qwen3, log)
        yield proc, url
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_met_serve_answers_the_openai_client(met_serve):
    _, url = met_serve
    client = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)
    assert [m.id for m in client.models.list().data] == ["tiny"]
    resp = client.completions.create(model="tiny", prompt="hello", max_tokens=6, temperature=0)
    assert resp.usage.completion_tokens == 6 and resp.choices[0].finish_reason == "length"
    chat = client.chat.completions.create(
        model="tiny", max_tokens=4, temperature=0, messages=[{"role": "user", "content": "hi"}]
    )
    assert chat.usage.completion_tokens <= 4
    assert httpx.get(url + "/v1/models").status_code == 401  # METRALE_API_KEY is honoured
    metrics = httpx.get(url + "/metrics").text
    assert 'metrale:generation_tokens_total{model_name="tiny"}' in metrics


def test_met_chat_streams_a_reply(met_serve):
    _, url = met_serve
    client = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)
    expected = (
        client.chat.completions.create(
            model="tiny", max_tokens=3, temperature=0, messages=[{"role": "user", "content": "hi"}]
        )
        .choices[0]
        .message.content
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "metrale_core",
            "chat",
            "--url",
            url,
            "--api-key",
            API_KEY,
            "-p",
            "hi",
            "--max-tokens",
            "3",
            "--temperature",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == expected + "\n"  # the streamed reply, then one newline
    bad = subprocess.run(
        [sys.executable, "-m", "metrale_core", "chat", "--url", url, "-p", "hi"],
        capture_output=True,
        text=True,
        timeout=60,
    )
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


def test_met_serve_data_parallel_answers_and_leaves_no_replica_on_sigterm(tiny_qwen3, tmp_path):
    """``--data-parallel-size 2``: two replica processes (children of ``met serve``) answer the
    same greedy tokens as one engine; SIGTERM ends the server and both replicas."""
    import psutil

    with open(tmp_path / "stderr.txt", "w+") as log:
        proc, url = _start(tiny_qwen3, log, "--data-parallel-size", "2", "--threads", "1")
        try:
            children = psutil.Process(proc.pid).children()  # the replicas, multiprocessing's helper
            assert sum("spawn_main" in " ".join(p.cmdline()) for p in children) == 2
            assert httpx.get(url + "/health").json()["replicas"] == {"0": "up", "1": "up"}
            client = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)
            texts = {
                client.completions.create(model="tiny", prompt=f"hello {i}", max_tokens=6, temperature=0)
                .choices[0]
                .text
                for i in (0, 0, 0)
            }
            assert len(texts) == 1  # whichever replica served it, the same greedy tokens
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) in (0, -signal.SIGTERM)  # uvicorn re-raises it when done
        finally:
            if proc.poll() is None:
                proc.kill()
        _, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, f"orphaned replica processes: {[p.pid for p in alive]}"
        log.seek(0)
        assert "Traceback" not in log.read()
