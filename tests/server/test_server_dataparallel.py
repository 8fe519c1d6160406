"""Data parallel over HTTP: two scripted-model replica processes behind one real uvicorn
server, driven by the official ``openai`` client.

Oracles: the shared in-process server (DP=1, same engine options) gives the greedy outputs DP=2
must equal; the pool's routing record and ``/metrics`` say which replica served what; the
replica processes' PIDs say whether they are gone.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import attrs
import httpx
import openai
import pytest
from server_testlib import random_text, scripted_served, wait_ready


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def dp(byte_tokenizer, byte_tokenizer_dir):
    """``(RunningServer, ReplicaPool, openai client)`` with two replicas."""
    from metrale_core.dataparallel import ReplicaPool
    from metrale_core.plugin.discovery import load_registry
    from metrale_core.server import ServerConfig, create_app, serve_in_thread

    registry = load_registry()
    factory = functools.partial(scripted_served, str(byte_tokenizer_dir))

    def load():
        return attrs.evolve(
            scripted_served(byte_tokenizer, registry=registry),
            async_front=functools.partial(ReplicaPool, factory=factory, size=2),
        )

    app = create_app(ServerConfig(served_model_name="scripted", shutdown_grace_s=2), load, registry)
    server = serve_in_thread(app)
    wait_ready(server.url, timeout=120)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    yield server, app.state.host.async_engine, client
    server.stop()


def _chat(client, prompt: str, max_tokens: int, **extra):
    """A streamed greedy chat: ``(text, finish_reason)``, or ``(error message, None)``."""
    text, reason = [], None
    try:
        stream = client.chat.completions.create(
            model="scripted",
            messages=[{"role": "user", "content": prompt}],
            stream=True,
            temperature=0,
            max_tokens=max_tokens,
            **extra,
        )
        for chunk in stream:
            if chunk.choices:
                text.append(chunk.choices[0].delta.content or "")
                reason = chunk.choices[0].finish_reason or reason
    except openai.APIError as exc:
        return str(exc), None
    return "".join(text), reason


def _load(client, prompts, max_tokens):
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda p: _chat(client, p, max_tokens), prompts))


def _metric(url: str, name: str, replica: int) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + "{") and f'replica="{replica}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} for replica {replica} not exported")


def test_sixteen_streams_complete_and_match_dp1(dp, client):
    _, pool, dp_client = dp
    prompts = [random_text(seed, 6 + seed % 5) for seed in range(16)]
    got = _load(dp_client, prompts, max_tokens=24)
    want = _load(client, prompts, max_tokens=24)  # the shared in-process (DP=1) server
    assert [reason for _, reason in got] == ["length"] * 16  # 0 lost
    assert got == want
    assert all(slot.routed > 0 for slot in pool.slots)  # both replicas served


def test_health_and_metrics_show_the_replicas(dp):
    server, pool, _ = dp
    health = httpx.get(server.url + "/health")
    assert health.status_code == 200 and health.json()["replicas"] == {"0": "up", "1": "up"}
    assert _metric(server.url, "metrale:replica_up", 0) == 1.0
    assert _metric(server.url, "metrale:replica_up", 1) == 1.0
    routed = sum(_metric(server.url, "metrale:replica_requests_routed_total", r) for r in (0, 1))
    assert routed == sum(slot.routed for slot in pool.slots) > 0
    text = httpx.get(server.url + "/metrics").text
    assert "metrale:kv_cache_usage_perc{" in text and "metrale:num_requests_running{" in text
    # the dashboard's snapshot: the replicas' sums, one line per replica
    snap = pool.snapshots.latest
    parts = [slot.client.stats.snapshot for slot in pool.slots]
    assert snap.generation_tokens_total == sum(p.generation_tokens_total for p in parts) > 0
    assert snap.requests_finished == sum(p.requests_finished for p in parts)
    assert [label for label, _ in snap.describe_extras()] == ["replica 0", "replica 1"]
    assert all(line.startswith("up, 0 running") for _, line in snap.describe_extras())


WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


def _every_route(client, url: str) -> list:
    out = []
    done = client.completions.create(model="scripted", prompt="hello", max_tokens=5, n=2, seed=1)
    out.append([(c.text, c.finish_reason) for c in done.choices])
    call = client.chat.completions.create(
        model="scripted", messages=[{"role": "user", "content": "weather in Paris?"}], tools=[WEATHER_TOOL]
    )
    out.append(call.choices[0].message.tool_calls[0].function.model_dump())
    think = client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "ponder"}])
    out.append((think.choices[0].message.content, think.choices[0].message.model_extra.get("reasoning_content")))
    out.append(client.responses.create(model="scripted", input="The capital?").output_text)
    body = {"model": "scripted", "max_tokens": 64, "messages": [{"role": "user", "content": "capital?"}]}
    out.append(httpx.post(url + "/v1/messages", json=body).json()["content"])
    out.append(httpx.post(url + "/tokenize", json={"prompt": "abc"}).json())
    return out


def test_every_route_answers_as_on_one_engine(dp, client, base_url):
    """Completions (n=2, seeded), chat with a tool call and with reasoning (the stream parsers
    travel to the replica), Responses, Messages and tokenize: the same answers as DP=1."""
    server, _, dp_client = dp
    got = _every_route(dp_client, server.url)
    assert got == _every_route(client, base_url)
    assert got[1]["name"] == "get_weather" and "Two and two" in got[2][1]


def test_a_client_that_leaves_aborts_its_request_on_the_replica(dp):
    server, pool, _ = dp
    with httpx.stream(
        "POST",
        server.url + "/v1/completions",
        json={"model": "scripted", "prompt": "go on", "max_tokens": 3000, "ignore_eos": True, "stream": True},
    ) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
    deadline = time.monotonic() + 30
    while any(slot.in_flight or _streaming(slot) for slot in pool.slots):  # aborted, not run out
        assert time.monotonic() < deadline, "the abandoned request kept running"
        time.sleep(0.01)


def test_second_turn_goes_to_the_replica_holding_the_prefix(dp):
    server, pool, client = dp
    first = [{"role": "user", "content": "Please count for me. " + random_text(99, 40)}]
    reply = client.chat.completions.create(model="scripted", messages=first, temperature=0)
    _, turn1 = pool.routes[-1]
    hits = _metric(server.url, "metrale:replica_prefix_affinity_hits_total", turn1.replica)
    second = [
        *first,
        {"role": "assistant", "content": reply.choices[0].message.content},
        {"role": "user", "content": "And now count again."},
    ]
    client.chat.completions.create(model="scripted", messages=second, temperature=0)
    _, turn2 = pool.routes[-1]
    assert turn2.replica == turn1.replica and turn2.affinity and turn2.matched_blocks >= 5
    assert _metric(server.url, "metrale:replica_prefix_affinity_hits_total", turn1.replica) == hits + 1


def test_killed_replica_fails_its_requests_and_comes_back(dp):
    server, pool, client = dp
    victim = pool.slots[0]
    old_pid = victim.client.pid
    prompts = [random_text(100 + seed, 8) for seed in range(16)]
    results: list = []
    load = threading.Thread(target=lambda: results.extend(_load(client, prompts, max_tokens=600)))
    load.start()
    deadline = time.monotonic() + 60
    while not (sum(slot.in_flight for slot in pool.slots) == 16 and _streaming(victim)):
        assert time.monotonic() < deadline, "the load never reached the replicas"
        time.sleep(0.01)
    doomed = victim.in_flight
    assert 0 < doomed < 16
    os.kill(old_pid, signal.SIGKILL)
    saw_503 = False
    while load.is_alive() or not saw_503:
        saw_503 = saw_503 or httpx.get(server.url + "/health").status_code == 503
        assert time.monotonic() < deadline + 60, "no 503 while the replica was down"
        time.sleep(0.01)
    load.join()
    failed = [text for text, reason in results if reason is None]
    assert len(failed) == doomed and all("replica 0" in text and "SIGKILL" in text for text in failed)
    assert [reason for _, reason in results if reason is not None] == ["length"] * (16 - doomed)
    wait_ready(server.url, timeout=120)  # restarted
    assert victim.up and victim.client.pid != old_pid and victim.restarts == 1
    assert not _alive(old_pid)
    before = victim.routed
    assert _load(client, [random_text(200 + s, 5) for s in range(4)], max_tokens=4) and victim.routed > before
    assert _metric(server.url, "metrale:replica_restarts_total", 0) == 1.0


def _streaming(slot) -> bool:
    """The replica has reported running requests (so the kill lands mid-generation)."""
    stats = slot.client.stats if slot.client is not None else None
    return stats is not None and stats.stats.num_running > 0


def test_stopping_the_server_stops_every_replica(dp):
    server, pool, _ = dp
    pids = [slot.client.pid for slot in pool.slots]
    assert all(_alive(pid) for pid in pids)
    server.stop()
    assert not any(_alive(pid) for pid in pids)
    assert pool.replicas_down == [0, 1]
