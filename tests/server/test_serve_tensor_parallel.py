"""``met serve --tensor-parallel-size 2`` as real processes on a tiny random Llama checkpoint: two
"machines" on loopback (``met serve`` rank 0 + ``met worker`` rank 1 with torchrun's variables)
give TP=1's tokens; a worker killed mid-request fails the request cleanly, the server stays up
answering 503 with the reason (on ``/health`` and new requests), the other workers are stopped,
and the server stopped afterwards exits non-zero with the reason; SIGTERM leaves no worker
process behind.  (Two network namespaces and a link taken down: ``tests/parallel/test_two_hosts.py``.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from server_testlib import wait_started

from metrale_core.parallel.executors import free_port
from metrale_core.testing.host_client import stop
from metrale_core.testing.serve_argv import TINY_SERVE_FLAGS, serve_argv
from metrale_core.testing.tiny_llama import greedy_text, write_tiny_llama

PROMPT = "the quick brown fox jumps over"


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def _serve(path: Path, port: int, log: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        serve_argv(path, port, "tiny", *TINY_SERVE_FLAGS, *extra),
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=open(log, "w"),
    )


def _ready(proc: subprocess.Popen, url: str, log: Path) -> None:
    wait_started(proc, url, log.read_text, live_timeout=90, ready_timeout=90)


def _complete(url: str, max_tokens: int = 12, timeout: float = 60) -> httpx.Response:
    return httpx.post(
        url + "/v1/completions",
        timeout=timeout,
        json={"model": "tiny", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True},
    )


def _workers(pid: int) -> list[int]:
    """The ``met worker`` processes whose parent is ``pid``."""
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"worker" in cmdline:
                kids.append(int(entry.name))
    return kids


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def test_serve_rank0_and_worker_rank1_on_loopback_give_tp1_tokens(tiny_llama, tmp_path):
    port, master = free_port(), free_port()
    dist = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master), "WORLD_SIZE": "2"}
    with open(tmp_path / "worker.txt", "w") as worker_log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "metrale_core", "worker"],
            env={**os.environ, **dist, "RANK": "1"},
            stdout=subprocess.DEVNULL,
            stderr=worker_log,
        )
    server = _serve(
        tiny_llama,
        port,
        tmp_path / "serve.txt",
        "--tensor-parallel-size",
        "2",
        "--distributed-executor-backend",
        "env",
        env={**dist, "RANK": "0"},
    )
    try:
        _ready(server, f"http://127.0.0.1:{port}", tmp_path / "serve.txt")
        resp = _complete(f"http://127.0.0.1:{port}")
        assert resp.status_code == 200, resp.text
        assert resp.json()["choices"][0]["text"] == greedy_text(tiny_llama, PROMPT, 12)
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 128 + signal.SIGTERM  # stopped gracefully, as without TP
        assert worker.wait(30) == 0  # rank 0 told it to stop
    finally:
        stop(server, worker)


def test_a_dead_worker_fails_the_request_and_the_server_stays_up_saying_why(tiny_llama, tmp_path):
    port = free_port()
    log = tmp_path / "serve.txt"
    server = _serve(tiny_llama, port, log, "--tensor-parallel-size", "3")  # the mp executor
    try:
        url = f"http://127.0.0.1:{port}"
        _ready(server, url, log)
        workers = _workers(server.pid)
        assert len(workers) == 2
        result: list = []
        request = threading.Thread(target=lambda: result.append(_complete(url, max_tokens=3000, timeout=60)))
        request.start()
        time.sleep(1.0)  # the request is decoding
        os.kill(workers[0], signal.SIGKILL)
        request.join(60)
        assert not request.is_alive(), "the in-flight request hung"
        (resp,) = result
        assert resp.status_code in (500, 503), resp.text
        assert "tensor-parallel worker rank" in resp.json()["error"]["message"]
        health = httpx.get(url + "/health")  # the server is still up, and says why it cannot serve
        assert health.status_code == 503 and health.json()["error"]["code"] == "engine_failed"
        assert "tensor-parallel worker rank" in health.json()["error"]["message"]
        later = _complete(url, max_tokens=2)
        assert later.status_code == 503 and later.json()["error"]["code"] == "engine_failed"
        deadline = time.monotonic() + 30
        while not _gone(workers[1]):  # the surviving worker was stopped too
            assert time.monotonic() < deadline, "the surviving worker was left running"
            time.sleep(0.1)
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 1
        assert "met serve: error: tensor-parallel worker rank" in log.read_text()
    finally:
        stop(server)


def test_sigterm_stops_every_worker_process(tiny_llama, tmp_path):
    port = free_port()
    log = tmp_path / "serve.txt"
    server = _serve(tiny_llama, port, log, "--tensor-parallel-size", "2")
    try:
        _ready(server, f"http://127.0.0.1:{port}", log)
        assert _complete(f"http://127.0.0.1:{port}", max_tokens=4).status_code == 200
        workers = _workers(server.pid)
        assert len(workers) == 1
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while not all(_gone(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(_gone(pid) for pid in workers), workers
    finally:
        stop(server)
