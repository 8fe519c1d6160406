"""``--stream-interval-ms``: the server's streams are paced by the engine bridge; the content a
client gets is the same paced or not (the pacing itself: ``tests/engine/test_async_engine.py``)."""

from __future__ import annotations

import json

import httpx
import pytest

BODY = {"prompt": "pace me", "max_tokens": 40, "temperature": 0.0, "ignore_eos": True}


def _streamed_text(url: str) -> tuple[str, int]:
    text, events = [], 0
    with httpx.stream("POST", url + "/v1/completions", json={**BODY, "stream": True}, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                events += 1
                text.append(json.loads(line[6:])["choices"][0]["text"])
    return "".join(text), events


@pytest.mark.parametrize(("interval_ms", "interval_s"), [(None, 0.02), (0.0, 0.0), (5000.0, 5.0)])
def test_the_interval_reaches_the_bridge_and_the_text_is_the_same(start_server, interval_ms, interval_s):
    options = {} if interval_ms is None else {"stream_interval_ms": interval_ms}
    server, host = start_server(**options)
    assert host.async_engine.stream_interval_s == pytest.approx(interval_s)
    whole = httpx.post(server.url + "/v1/completions", json=BODY, timeout=60).json()["choices"][0]["text"]
    text, events = _streamed_text(server.url)
    assert text == whole and len(whole) > 10
    if interval_s >= 5:  # the scripted model's 40 steps take far less: the first event, then the last
        assert events <= 3
