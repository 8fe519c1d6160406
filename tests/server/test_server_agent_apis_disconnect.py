"""A client that leaves a Responses or Messages stream midway aborts its engine request at once
(counted as ``abort`` in ``/metrics``) and frees its KV blocks."""

from __future__ import annotations

import time

import httpx
import pytest


def _aborts(url: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("metrale:request_success_total{") and 'finished_reason="abort"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize(
    "route,body",
    [
        ("/v1/responses", {"model": "scripted", "input": "tell me a story", "stream": True, "max_output_tokens": 3000}),
        (
            "/v1/messages",
            {
                "model": "scripted",
                "max_tokens": 3000,
                "stream": True,
                "messages": [{"role": "user", "content": "tell me a story"}],
            },
        ),
    ],
)
def test_leaving_a_stream_aborts_and_frees_blocks(start_server, route, body):
    server, host = start_server()
    engine = host.served.engine
    before = _aborts(server.url)
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", server.url + route, json=body) as r:
            assert r.status_code == 200
            for n, _ in enumerate(r.iter_lines()):
                if n > 20:
                    break
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        stats = engine.stats()
        if stats.num_running == 0 and _aborts(server.url) == before + 1:
            break
        time.sleep(0.05)
    stats = engine.stats()
    assert stats.num_running == 0 and stats.num_waiting == 0
    assert stats.num_free_blocks == stats.num_blocks
    assert _aborts(server.url) == before + 1
