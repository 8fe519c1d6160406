"""The ray executor across two hosts (network namespaces joined by a veth pair): a Ray head in
host A (no CPUs for actors), a Ray node joined from host B, ``met serve --distributed-executor-backend
ray`` in host A with ``RAY_ADDRESS``; the TP=2 worker actor lands on host B.  Greedy text equals one
process's; host B's link taken down mid-stream fails the stream naming rank 1 and its host, the
server stays up (503 ``engine_failed``), the actor on host B ends itself, and the server exits
with the reason.  Without root or ``ip netns`` the test skips (fails under ``CI=true``)."""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from metrale_core.testing.host_client import (
    PROMPT,
    Client,
    env_for,
    expect_lost_rank_exit,
    lose_rank_mid_stream,
    serve_tp2,
    stop,
)
from metrale_core.testing.netns import Host, two_hosts
from metrale_core.testing.requires import missing
from metrale_core.testing.tiny_llama import greedy_text, write_tiny_llama

TIMEOUT_S = 15  # --distributed-timeout: generous, a loaded machine can starve a heartbeat thread for seconds
RAY_PORT = 6379


def _ray(host: Host, temp_dir: str, *args: str) -> None:
    """``ray start`` on ``host`` with its own temporary directory: the default one's
    ``ray_current_cluster`` file would make every later plain ``ray.init()`` on this machine join
    this (soon gone) cluster instead of starting its own."""
    ray = str(Path(sys.executable).with_name("ray"))
    env = env_for(host, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    argv = [ray, "start", *args, "--temp-dir", temp_dir, "--disable-usage-stats"]
    done = host.run(argv, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.fixture(scope="module")
def ray_hosts():
    try:
        import ray  # noqa: F401
    except ImportError:
        missing("Ray is not installed (pip install -e plugins/metrale-ray installs it)")
    hosts = two_hosts("metray")
    temp_dir = tempfile.mkdtemp(prefix="metray-")  # short: Ray's socket paths live under it
    try:
        head = ["--head", "--node-ip-address", hosts.a.addr, "--port", str(RAY_PORT), "--num-cpus", "0"]
        _ray(hosts.a, temp_dir, *head)
        node = ["--address", f"{hosts.a.addr}:{RAY_PORT}", "--node-ip-address", hosts.b.addr, "--num-cpus", "1"]
        _ray(hosts.b, temp_dir, *node)
        yield hosts
    finally:
        hosts.close()  # the Ray daemons of both hosts are killed by pid (never 'ray stop': it is machine-wide)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_ray_workers_on_another_host_and_its_link_lost_mid_request(ray_hosts, tmp_path):
    hosts = ray_hosts
    model = write_tiny_llama(tmp_path / "tiny-llama")
    expected = greedy_text(model, PROMPT, 12)
    log = tmp_path / "serve.txt"
    ray_env = dict(RAY_ADDRESS=f"{hosts.a.addr}:{RAY_PORT}", RAY_AUTH_MODE="disabled")
    server = serve_tp2(hosts.a, model, log, TIMEOUT_S, "ray", **ray_env)
    client = Client(hosts.a)
    try:
        client.wait_ready(server, log, timeout=120)
        message, _ = lose_rank_mid_stream(client, hosts.b, expected)
        found = re.search(rf"rank 1 \({re.escape(hosts.b.addr)}, pid (\d+)\)", message)
        assert found, message
        actor = int(found.group(1))  # the worker actor's process, on host B

        deadline = time.monotonic() + 60
        while _alive(actor):  # cut off from its owner, the actor ends itself
            assert time.monotonic() < deadline, f"the worker actor (pid {actor}) on the lost host is still running"
            time.sleep(0.2)
        assert actor not in hosts.b.pids()
        expect_lost_rank_exit(server, log)
    finally:
        client.pool.shutdown(wait=False, cancel_futures=True)
        stop(server)
