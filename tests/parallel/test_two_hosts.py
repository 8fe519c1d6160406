"""Tensor and data parallelism across two hosts (network namespaces joined by a veth pair), with
the link to host B taken down mid-request.

Host A (198.18.0.1) runs ``met serve``; host B (198.18.0.2) runs ``met worker`` (TP rank 1, through
torch.distributed / gloo) or ``met replica --connect`` (a remote data-parallel replica).  Oracles:
the greedy text of one in-process engine (``testing.tiny_llama.greedy_text``); the stream's error
and ``/health``'s 503 name the lost rank or replica and its host; ``ip netns pids`` says which
processes are left on each host.  Every wait is a poll with a generous bound, never a speed
assumption.  Without root or ``ip netns`` the tests skip (and fail under ``CI=true``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from metrale_core.testing.netns import Host, TwoHosts, two_hosts
from metrale_core.testing.tiny_llama import greedy_text, write_tiny_llama

PROMPT = "the quick brown fox jumps over"
TIMEOUT_S = 4  # --distributed-timeout: how soon a silent host is declared lost
PORT = 8000  # on host A's loopback
MASTER_PORT = 29500


@pytest.fixture(scope="module")
def hosts() -> Iterator[TwoHosts]:
    made = two_hosts("met2h")
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, str]:
    path = write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))
    return path, greedy_text(path, PROMPT, 12)


def _env(host: Host, **extra: str) -> dict[str, str]:
    """The environment of a process on ``host``: gloo on its end of the link, one torch thread."""
    return {**os.environ, "GLOO_SOCKET_IFNAME": host.dev, "OMP_NUM_THREADS": "1", "NO_COLOR": "1", **extra}


def _met(host: Host, args: list[str], log: Path, **env: str) -> subprocess.Popen:
    return host.popen(
        [sys.executable, "-m", "metrale_core", *args],
        env=_env(host, **env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(log, "w"),
    )


def _serve(hosts: TwoHosts, model: Path, log: Path, *extra: str, **env: str) -> subprocess.Popen:
    args = ["serve", str(model), "--port", str(PORT), "--no-tui", "--served-model-name", "tiny"]
    args += ["--kv-cache-memory", "8M", "--shutdown-grace", "2", "--threads", "1", "--weight-format", "exact"]
    args += ["--distributed-timeout", str(TIMEOUT_S), *extra]
    return _met(hosts.a, args, log, **env)


class Client:
    """HTTP to host A's loopback, from threads inside host A's namespace."""

    def __init__(self, host: Host) -> None:
        self.pool = host.threads(4)
        self.url = f"http://127.0.0.1:{PORT}"

    def call(self, fn, *args):
        return self.pool.submit(fn, *args)

    def get(self, path: str) -> httpx.Response:
        return self.call(httpx.get, self.url + path).result(60)

    def complete(self, max_tokens: int = 12) -> httpx.Response:
        body = {"model": "tiny", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
        return self.call(lambda: httpx.post(self.url + "/v1/completions", json=body, timeout=120)).result(180)

    def wait_ready(self, proc: subprocess.Popen, log: Path, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.get("/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"met serve did not become ready:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)

    def stream_until_error(self, started, max_tokens: int = 4000):
        """A long greedy stream; ``started`` is set at its first token; returns the error event's
        message (fails if the stream ends without one)."""
        body = {
            "model": "tiny",
            "prompt": PROMPT,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }

        def run() -> str:
            with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=120) as r:
                assert r.status_code == 200, r.read()
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        return str(event["error"]["message"])
                    started.set()
            raise AssertionError("the stream ended without an error event")

        return self.call(run)


def _wait_exit(proc: subprocess.Popen, timeout: float, what: str) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{what} did not exit within {timeout}s") from None


def _stop(*procs: subprocess.Popen) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _no_pids(host: Host, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while host.pids():
        assert time.monotonic() < deadline, f"processes left on {host.ns}: {host.pids()}"
        time.sleep(0.2)


def test_tensor_parallel_over_two_hosts_and_a_link_lost_mid_request(hosts, tiny, tmp_path):
    """TP=2, rank 0 (``met serve``) on host A, rank 1 (``met worker``) on host B: TP=1's text;
    then host B's link goes down mid-stream: the stream ends with an error naming rank 1 and its
    host, the server stays up with ``/health`` 503 ``engine_failed`` and refuses new requests
    with the same reason, the worker exits by itself, and nothing is left on either host."""
    model, expected = tiny
    dist = {"MASTER_ADDR": hosts.a.addr, "MASTER_PORT": str(MASTER_PORT), "WORLD_SIZE": "2"}
    worker = _met(hosts.b, ["worker"], tmp_path / "worker.txt", **dist, RANK="1")
    log = tmp_path / "serve.txt"
    server = _serve(
        hosts, model, log, "--tensor-parallel-size", "2", "--distributed-executor-backend", "env", **dist, RANK="0"
    )
    client = Client(hosts.a)
    try:
        client.wait_ready(server, log)
        resp = client.complete()
        assert resp.status_code == 200, resp.text
        assert resp.json()["choices"][0]["text"] == expected

        started = threading.Event()
        error = client.stream_until_error(started)
        assert started.wait(60), "the stream never started"
        hosts.b.link(up=False)
        message = error.result(120)
        assert f"rank 1 ({hosts.b.addr}, pid {worker.pid})" in message, message
        assert "--distributed-timeout" in message

        health = client.get("/health")  # still up, and says why it cannot serve
        assert health.status_code == 503, health.text
        assert health.json()["error"]["code"] == "engine_failed"
        assert f"rank 1 ({hosts.b.addr}" in health.json()["error"]["message"]
        later = client.complete(max_tokens=2)
        assert later.status_code == 503 and later.json()["error"]["code"] == "engine_failed"
        assert client.get("/health/live").status_code == 200

        assert _wait_exit(worker, 60, "the worker on the lost host") == 1  # by itself, no orphan
        assert "lost rank 0" in (tmp_path / "worker.txt").read_text()
        _no_pids(hosts.b)
        server.send_signal(signal.SIGTERM)
        assert _wait_exit(server, 60, "met serve") == 1
        assert "met serve: error: lost tensor-parallel rank 1" in log.read_text()
        _no_pids(hosts.a)
    finally:
        client.pool.shutdown(wait=False, cancel_futures=True)
        _stop(server, worker)
        hosts.b.link(up=True)
