"""Processes of ``met`` in a test host (``testing.netns``) and HTTP to the server in one.

Owner: the two-host tests (``tests/parallel/test_two_hosts.py``, metrale-ray's
``test_ray_two_hosts.py``): :func:`met` starts ``met serve`` / ``met worker`` / ``met replica`` in a
host, :func:`serve` the tiny model's server with the tests' flags, :class:`Client` talks to it from
threads inside that host's namespace; :func:`stop` also reaps the single-host serve tests' processes.

Invariants:
- Every wait is a poll with a generous bound (never an assumption about speed); a server that
  does not become ready fails with the tails of every log beside its own.
- Processes run with ``GLOO_SOCKET_IFNAME`` set to their host's end of the link (gloo would
  otherwise pick an address by the hostname, which names no namespace) and one torch thread.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from metrale_core.testing.netns import Host
from metrale_core.testing.serve_argv import TINY_SERVE_FLAGS, met_argv, serve_args

__all__ = [
    "PORT",
    "PROMPT",
    "Client",
    "expect_lost_rank_exit",
    "lose_rank_mid_stream",
    "met",
    "metric",
    "no_pids",
    "serve",
    "serve_tp2",
    "stop",
    "wait_exit",
]

#: The tests' prompt: under one KV block, so data parallel routes it by load alone (no affinity).
PROMPT = "the quick fox"
#: ``met serve``'s port on its host's loopback.
PORT = 8000


def env_for(host: Host, **extra: str) -> dict[str, str]:
    """The environment of a process on ``host``: gloo on its end of the link, one torch thread."""
    return {**os.environ, "GLOO_SOCKET_IFNAME": host.dev, "OMP_NUM_THREADS": "1", "NO_COLOR": "1", **extra}


def met(host: Host, args: list[str], log: Path, **env: str) -> subprocess.Popen:
    return host.popen(
        met_argv(*args),
        env=env_for(host, **env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(log, "w"),
    )


def serve(host: Host, model: Path, log: Path, timeout_s: float, *extra: str, **env: str) -> subprocess.Popen:
    """``met serve`` of ``model`` (named ``tiny``) on ``host``, collectives timing out after ``timeout_s``."""
    args = serve_args(model, PORT, "tiny", *TINY_SERVE_FLAGS, "--distributed-timeout", str(timeout_s), *extra)
    return met(host, args, log, **env)


def serve_tp2(host: Host, model: Path, log: Path, timeout_s: float, backend: str, **env: str) -> subprocess.Popen:
    """:func:`serve` with tensor parallelism 2 over the executor ``backend`` (``env``, ``ray``)."""
    tp = ("--tensor-parallel-size", "2", "--distributed-executor-backend", backend)
    return serve(host, model, log, timeout_s, *tp, **env)


class Client:
    """HTTP to ``met serve`` on ``host``'s loopback, from threads inside ``host``'s namespace."""

    def __init__(self, host: Host) -> None:
        self.pool = host.threads(4)
        self.url = f"http://127.0.0.1:{PORT}"

    def call(self, fn: Any, *args: Any) -> Any:
        return self.pool.submit(fn, *args)

    def get(self, path: str) -> httpx.Response:
        return self.call(httpx.get, self.url + path).result(60)

    def complete(self, max_tokens: int = 12) -> httpx.Response:
        body = {"model": "tiny", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
        return self.call(lambda: httpx.post(self.url + "/v1/completions", json=body, timeout=120)).result(180)

    def wait_ready(self, proc: subprocess.Popen, log: Path, timeout: float = 90) -> None:
        """Poll ``/health`` until 200; on failure, the server's log (and its siblings') tails."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.get("/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                tails = []
                for path in sorted(log.parent.glob("*.txt")):
                    lines = [line for line in path.read_text().splitlines() if "GET /health" not in line]
                    tails.append(f"--- {path.name}:\n" + "\n".join(lines[-25:]))
                raise AssertionError("met serve did not become ready:\n" + "\n".join(tails))
            time.sleep(0.2)

    def stream(self, started: threading.Event, max_tokens: int = 4000) -> Any:
        """A long greedy stream; ``started`` is set at its first token.  A future of
        ``("error", message)`` or ``("done", finish_reason)``."""
        body = {
            "model": "tiny",
            "prompt": PROMPT,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }

        def run() -> tuple[str, str]:
            reason = ""
            with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=120) as r:
                assert r.status_code == 200, r.read()
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        return "error", str(event["error"]["message"])
                    started.set()
                    reason = event["choices"][0].get("finish_reason") or reason
            return "done", reason

        return self.call(run)


def lose_rank_mid_stream(client: Client, lost: Host, expected: str) -> tuple[str, dict[str, Any]]:
    """The TP=2 lost-rank scenario up to the server's refusal: the greedy text is ``expected``;
    ``lost``'s link goes down mid-stream; the stream ends with an error naming
    ``--distributed-timeout``; ``/health`` says 503 ``engine_failed`` and a new request is refused
    the same.  Returns the stream's error message and ``/health``'s body (the callers check which
    rank and host they name)."""
    resp = client.complete()
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["text"] == expected

    started = threading.Event()
    stream = client.stream(started)
    assert started.wait(60), "the stream never started"
    lost.link(up=False)
    outcome, message = stream.result(120)
    assert outcome == "error", (outcome, message)
    assert "--distributed-timeout" in message, message

    health = client.get("/health")  # still up, and says why it cannot serve
    assert health.status_code == 503 and health.json()["error"]["code"] == "engine_failed", health.text
    later = client.complete(max_tokens=2)
    assert later.status_code == 503 and later.json()["error"]["code"] == "engine_failed"
    return message, health.json()


def expect_lost_rank_exit(server: subprocess.Popen, log: Path) -> None:
    """SIGTERM to a server that lost TP rank 1: it exits 1 and its log says so."""
    server.send_signal(signal.SIGTERM)
    assert wait_exit(server, 60, "met serve") == 1
    assert "met serve: error: lost tensor-parallel rank 1" in log.read_text()


def wait_exit(proc: subprocess.Popen, timeout: float, what: str) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{what} did not exit within {timeout}s") from None


def stop(*procs: subprocess.Popen) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def metric(client: Client, name: str, replica: int) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + "{") and f'replica="{replica}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} for replica {replica} not exported")


def no_pids(host: Host, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while host.pids():
        assert time.monotonic() < deadline, f"processes left on {host.ns}: {host.pids()}"
        time.sleep(0.2)
