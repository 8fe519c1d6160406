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

import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from metrale_core.testing.host_client import (
    PROMPT,
    Client,
    expect_lost_rank_exit,
    lose_rank_mid_stream,
    met,
    metric,
    no_pids,
    serve,
    serve_tp2,
    stop,
    wait_exit,
)
from metrale_core.testing.netns import TwoHosts, two_hosts
from metrale_core.testing.tiny_llama import greedy_text, write_tiny_llama

TIMEOUT_S = 15  # --distributed-timeout: generous, a loaded 2-core CI machine can starve a heartbeat thread for seconds
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


def test_tensor_parallel_over_two_hosts_and_a_link_lost_mid_request(hosts, tiny, tmp_path):
    """TP=2, rank 0 (``met serve``) on host A, rank 1 (``met worker``) on host B: TP=1's text;
    then host B's link goes down mid-stream: the stream ends with an error naming rank 1 and its
    host, the server stays up with ``/health`` 503 ``engine_failed`` and refuses new requests
    with the same reason, the worker exits by itself, and nothing is left on either host."""
    model, expected = tiny
    dist = {"MASTER_ADDR": hosts.a.addr, "MASTER_PORT": str(MASTER_PORT), "WORLD_SIZE": "2"}
    worker = met(hosts.b, ["worker"], tmp_path / "worker.txt", **dist, RANK="1")
    log = tmp_path / "serve.txt"
    server = serve_tp2(hosts.a, model, log, TIMEOUT_S, "env", **dist, RANK="0")
    client = Client(hosts.a)
    try:
        client.wait_ready(server, log)
        message, health = lose_rank_mid_stream(client, hosts.b, expected)
        assert f"rank 1 ({hosts.b.addr}, pid {worker.pid})" in message, message
        assert f"rank 1 ({hosts.b.addr}" in health["error"]["message"]
        assert client.get("/health/live").status_code == 200

        assert wait_exit(worker, 60, "the worker on the lost host") == 1  # by itself, no orphan
        assert "lost rank 0" in (tmp_path / "worker.txt").read_text()
        no_pids(hosts.b)
        expect_lost_rank_exit(server, log)
        no_pids(hosts.a)
    finally:
        client.pool.shutdown(wait=False, cancel_futures=True)
        stop(server, worker)
        hosts.b.link(up=True)


def test_data_parallel_with_a_remote_replica_and_its_link_lost_mid_request(hosts, tiny, tmp_path):
    """DP=2: replica 0 in ``met serve`` on host A, replica 1 remote (``met replica --connect`` on
    host B): both give the single engine's text; host B's link goes down while each replica
    streams: replica 1's stream fails naming it and its host, replica 0's runs to its end,
    ``/health`` says 503 ``replica_down`` and new requests are served by replica 0; the remote
    replica exits by itself; a new ``met replica`` (link back up) takes the slot again; at
    shutdown nothing is left on either host."""
    model, expected = tiny
    key = {"METRALE_REPLICA_KEY": "two-hosts-test-key"}
    address = f"{hosts.a.addr}:29600"
    log = tmp_path / "serve.txt"
    server = serve(
        hosts.a,
        model,
        log,
        TIMEOUT_S,
        "--data-parallel-size",
        "2",
        "--data-parallel-size-local",
        "1",
        "--data-parallel-address",
        address,
        **key,
    )
    remote = met(hosts.b, ["replica", "--connect", address], tmp_path / "replica.txt", **key)
    client = Client(hosts.a)
    again = None
    try:
        client.wait_ready(server, log)
        assert client.get("/health").json()["replicas"] == {"0": "up", "1": "up"}
        for _ in range(2):  # an idle pool alternates: one request on each replica
            resp = client.complete()
            assert resp.status_code == 200, resp.text
            assert resp.json()["choices"][0]["text"] == expected
        assert metric(client, "metrale:replica_requests_routed_total", 1) == 1.0

        started = [threading.Event(), threading.Event()]
        streams = [client.stream(ev, max_tokens=1500) for ev in started]
        assert all(ev.wait(60) for ev in started), "the streams never started"
        hosts.b.link(up=False)
        outcomes = sorted(s.result(180) for s in streams)
        assert outcomes[0] == ("done", "length"), outcomes  # replica 0 kept serving
        kind, message = outcomes[1]
        assert kind == "error" and f"replica 1 (pid {remote.pid} on {hosts.b.addr})" in message, message
        assert "--distributed-timeout" in message

        health = client.get("/health")
        assert health.status_code == 503 and health.json()["error"]["code"] == "replica_down", health.text
        resp = client.complete()  # served by replica 0
        assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == expected
        assert wait_exit(remote, 60, "the remote replica on the lost host") == 1  # by itself
        assert "lost the front" in (tmp_path / "replica.txt").read_text()
        no_pids(hosts.b)

        hosts.b.link(up=True)  # a replica that connects again takes the free slot
        again = met(hosts.b, ["replica", "--connect", address], tmp_path / "again.txt", **key)
        client.wait_ready(server, log)
        server.send_signal(signal.SIGTERM)
        wait_exit(server, 60, "met serve")
        assert wait_exit(again, 60, "the reconnected replica") == 0  # told to stop by the front
        no_pids(hosts.a)
        no_pids(hosts.b)
    finally:
        client.pool.shutdown(wait=False, cancel_futures=True)
        stop(server, remote, *([again] if again else []))
        hosts.b.link(up=True)
