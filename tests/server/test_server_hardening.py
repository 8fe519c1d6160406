"""One request never hurts another (issue 16), through real uvicorn on loopback.

Each test reproduces one defect of the hardening report: a poisonous ``logit_bias``, CPU work on
the event loop, runaway chat templates, streams that bypassed admission, non-streaming requests
that kept running after a disconnect, streams cut off at shutdown, requests that could never
fit, timeouts, secrets in logs and ``/health``; plus the chaos test (good streams keep their solo
output while every poisonous request is sent) and a scrape of ``/metrics`` back to idle.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import attrs
import httpx
import pytest
from server_testlib import CHATML, ScriptedLM, stream_while_stopping

#: ChatML plus three hostile branches switched on by chat_template_kwargs.
HOSTILE = (
    "{% if spin %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
    "{% endfor %}{% endif %}"
    "{% if huge %}{% for i in range(10**9) %}{% endfor %}{% endif %}"
    "{% if big %}{{ 'x' * 10**9 }}{% endif %}"
    "{% if flood %}{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}"
    "{% endfor %}{% endif %}"
) + CHATML


def _chat(content: str, **extra) -> dict:
    return {"model": "scripted", "messages": [{"role": "user", "content": content}], "temperature": 0, **extra}


@pytest.fixture(scope="module")
def hostile(start_server, byte_tokenizer):
    """A server whose chat template misbehaves on request (and otherwise is ChatML)."""
    from metrale_core.engine import EngineConfig, LLMEngine
    from metrale_core.server import ServedModel

    tok = attrs.evolve(byte_tokenizer, chat_template=HOSTILE)

    def load():
        engine = LLMEngine(
            ScriptedLM(tok),
            EngineConfig(block_size=16, num_kv_blocks=512, max_num_seqs=32, max_prefill_tokens=2048),
            tokenizer=tok,
        )
        return ServedModel(engine=engine, tokenizer=tok, model_type="qwen3")

    return start_server(loader=load, shutdown_grace_s=1.0, max_waiting=64)


class _HeldJobs:
    """Stands in for the frontend pool (``offload._FRONTEND_POOL``): every job waits for
    :attr:`release` before it runs; :attr:`names` says which functions were sent off the loop."""

    def __init__(self, pool) -> None:
        self._pool = pool
        self.entered, self.release = threading.Event(), threading.Event()
        self.names: list[str] = []

    def get(self):
        return self

    def submit(self, fn, *args):
        def held():
            self.names.append(getattr(fn, "func", fn).__name__)
            self.entered.set()
            self.release.wait(60)
            return fn(*args)

        return self._pool.submit(held)


def _health_while_held(monkeypatch, url: str, send) -> list[str]:
    """Run ``send`` on a thread while the request's off-loop jobs are held, and prove by order (no
    speed bound: CI is a busy machine) that ``/health`` answers 200 while a job of the request is
    still in flight; the functions the request ran off the loop are returned.  Were that work on
    the event loop, ``/health`` could not answer and would fail by its generous timeout."""
    from metrale_core.server import offload

    jobs = _HeldJobs(offload._FRONTEND_POOL.get())
    monkeypatch.setattr(offload, "_FRONTEND_POOL", jobs)
    thread = threading.Thread(target=send)
    thread.start()
    try:
        assert jobs.entered.wait(60), "the request sent no work off the event loop"
        assert httpx.get(url + "/health", timeout=60).status_code == 200
        assert not jobs.release.is_set()  # answered while the request's job was held
    finally:
        jobs.release.set()
        thread.join(60)
    assert not thread.is_alive()
    return jobs.names


def _wait(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


# --- 1: logit_bias ---------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["99999999", "-1"])
def test_logit_bias_outside_the_vocabulary_is_400(base_url, key):
    resp = httpx.post(base_url + "/v1/chat/completions", json=_chat("hi", logit_bias={key: 1}), timeout=30)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == f"logit_bias.{key}" and "vocabulary" in error["message"]


# --- 2: CPU work off the loop, early reject, bounded templates --------------------------------


def test_huge_prompt_is_refused_before_tokenizing_and_health_stays_up(start_server, monkeypatch):
    server, _ = start_server()
    url = server.url
    body = json.dumps(_chat("x" * (8 << 20))).encode()
    result = {}

    def send():
        result["resp"] = httpx.post(
            url + "/v1/chat/completions", content=body, timeout=60, headers={"content-type": "application/json"}
        )

    names = _health_while_held(monkeypatch, url, send)
    assert names[:2] == ["_parse", "chat_prompt"]  # the 8 MB body is parsed and measured off the loop
    resp = result["resp"]
    assert resp.status_code == 400, resp.text
    assert "characters" in resp.json()["error"]["message"]
    assert resp.json()["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize(
    "switch, words",
    [
        ("spin", ("time budget",)),
        ("flood", ("output cap", "time budget")),
        ("big", ("output cap",)),
        ("huge", ("range",)),
    ],
)
def test_runaway_template_is_400_and_the_server_stays_healthy(hostile, switch, words, monkeypatch):
    url = hostile[0].url
    result = {}

    def send():
        result["resp"] = httpx.post(
            url + "/v1/chat/completions",
            timeout=30,
            json=_chat("hi", max_tokens=2, chat_template_kwargs={switch: True}),
        )

    assert "chat_prompt" in _health_while_held(monkeypatch, url, send)  # the template renders off the loop
    resp = result["resp"]
    assert resp.status_code == 400, resp.text
    message = resp.json()["error"]["message"]
    assert "chat template" in message and any(w in message.lower() for w in words)
    ok = httpx.post(url + "/v1/chat/completions", json=_chat("count", max_tokens=3), timeout=30)
    assert ok.status_code == 200


# --- 3: admission counts streams at once ------------------------------------------------------


def test_streams_are_counted_at_admission(start_server):
    server, host = start_server(max_waiting=1, engine_options={"max_num_seqs": 1})
    body = {"prompt": "abc", "max_tokens": 2000, "ignore_eos": True, "stream": True}

    async def burst() -> list[int]:
        # an admitted stream stays open until every request of the burst has its answer: one that
        # closed early would free its slot for a later one, however loaded the machine is
        answered, everyone = [0], asyncio.Event()
        async with httpx.AsyncClient(timeout=60) as client:

            async def one() -> int:
                async with client.stream("POST", server.url + "/v1/completions", json=body) as resp:
                    status = resp.status_code
                    answered[0] += 1
                    if answered[0] == 40:
                        everyone.set()
                    if status == 200:
                        async for _ in resp.aiter_lines():
                            break
                        await everyone.wait()
                    return status

            return await asyncio.gather(*[one() for _ in range(40)])

    statuses = asyncio.run(burst())
    assert statuses.count(200) <= 2, statuses
    assert statuses.count(503) >= 38, statuses
    assert _wait(lambda: host.in_flight == 0)


# --- 4: a non-streaming request is aborted when its client goes -------------------------------


def test_non_streaming_request_is_aborted_on_disconnect(start_server):
    server, host = start_server()
    with pytest.raises(httpx.TimeoutException):
        httpx.post(
            server.url + "/v1/completions", timeout=0.5, json={"prompt": "abc", "max_tokens": 4000, "ignore_eos": True}
        )
    assert _wait(lambda: host.in_flight == 0, timeout=3.0), host.in_flight
    engine = host.served.engine
    assert _wait(lambda: not engine.scheduler.running and not engine.scheduler.waiting, 3.0)


# --- 6: streams that outlive the grace period end with an error event and [DONE] -------------


def test_streams_past_the_grace_end_with_an_error_event(start_server):
    server, _host = start_server(shutdown_grace_s=0.3)
    rest = stream_while_stopping(server, max_tokens=4000)
    assert rest[-1] == "data: [DONE]"
    error = json.loads(rest[-2][len("data: ") :])["error"]
    assert error["code"] == "shutting_down" and "shutting down" in error["message"]
    assert not server.thread.is_alive()


# --- 8: a request that can never fit is a 400 naming the limit --------------------------------


def test_request_beyond_the_whole_capacity_is_400(start_server):
    server, _ = start_server(max_waiting=4, engine_options={"max_num_seqs": 4})
    resp = httpx.post(server.url + "/v1/chat/completions", json=_chat("hi", n=9), timeout=30)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "request_too_large" and "8" in error["message"]
    assert "Retry-After" not in resp.headers


# --- 9: timeout is partial text with finish_reason "timeout" ----------------------------------


def test_timeout_returns_partial_text_with_finish_reason(start_server):
    server, _ = start_server(engine_options={"request_timeout_s": 0.3})
    body = {"prompt": "abc", "max_tokens": 4000, "ignore_eos": True}
    resp = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "timeout"
    assert 0 < resp.json()["usage"]["completion_tokens"] < 4000
    with httpx.stream("POST", server.url + "/v1/completions", timeout=60, json={**body, "stream": True}) as stream:
        events = [line for line in stream.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "timeout"


# --- 10: no secrets in the log or on /health --------------------------------------------------


def test_failed_load_does_not_show_the_path_on_health():
    from metrale_core.server import ServerConfig, create_app, serve_in_thread

    def broken():
        raise FileNotFoundError("/home/alice/secret-models/model.safetensors is missing")

    server = serve_in_thread(create_app(ServerConfig(served_model_name="x"), broken))
    try:
        assert _wait(lambda: httpx.get(server.url + "/health").json()["error"]["code"] == "model_load_failed")
        message = httpx.get(server.url + "/health").json()["error"]["message"]
        assert "FileNotFoundError" in message and "/home/alice" not in message
    finally:
        server.stop()


_LOGGING_SCRIPT = """
from loguru import logger
from metrale_core.cli.main import configure_logging

configure_logging("info")


def fail(prompt_text):
    token_ids = [n * 1111 for n in (37, 38)]
    raise ValueError("boom")


secret = "-".join(["SECRET", "PROMPT", "TEXT"])
try:
    fail(secret)
except ValueError:
    logger.exception("request failed")
"""


def test_production_logging_prints_no_local_variables(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "log_failure.py"  # a file: loguru's diagnose needs the source
    script.write_text(_LOGGING_SCRIPT)
    err = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120).stderr
    assert "boom" in err and "Traceback" in err
    assert "SECRET-PROMPT-TEXT" not in err and "41107" not in err


# --- the chaos test ---------------------------------------------------------------------------

POISON = [
    ("bias-oov", _chat("hi", logit_bias={"99999999": 1})),
    ("bias-negative", _chat("hi", logit_bias={"-1": 5})),
    ("surrogate", b'{"messages": [{"role": "user", "content": "\\ud800"}]}'),
    ("deep-json", b'{"messages": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"),
    ("huge-prompt", _chat("y" * (4 << 20))),
    ("spin-template", _chat("hi", chat_template_kwargs={"spin": True})),
    ("flood-template", _chat("hi", chat_template_kwargs={"flood": True})),
    ("kwarg-collision", _chat("hi", chat_template_kwargs={"template": "x"})),
    (
        "tools-properties-list",
        _chat(
            "hi",
            tools=[
                {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": ["a"]}}}
            ],
        ),
    ),
    ("n-too-big", _chat("hi", n=128, max_tokens=2)),
    ("bias-too-many", _chat("hi", logit_bias={str(i): 1 for i in range(301)})),
    ("stop-too-long", _chat("hi", stop=["z" * 100_000])),
]


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_chaos_good_streams_keep_their_solo_output(hostile):
    url = hostile[0].url
    goods = [_chat(word, max_tokens=40, stream=True) for word in ("count", "capital", "café", "ponder") * 2]

    def stream_text(client: httpx.Client, body: dict) -> str:
        pieces, finish = [], None
        with client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if not line or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                assert "error" not in event, event
                for choice in event["choices"]:
                    delta = choice["delta"]
                    # an event may carry the end of the reasoning and the start of the answer
                    # (deltas coalesced while the client lagged): the reasoning came first
                    pieces.append((delta.get("reasoning_content") or "") + (delta.get("content") or ""))
                    finish = choice["finish_reason"] or finish
        return "".join(pieces) + f"|{finish}"

    with httpx.Client(timeout=60) as client:
        solo = [stream_text(client, body) for body in goods]
    results: dict[int, str] = {}
    poisoned: dict[str, int] = {}

    def good(i: int) -> None:
        with httpx.Client(timeout=60) as client:
            results[i] = stream_text(client, goods[i])

    def poison() -> None:
        with httpx.Client(timeout=60) as client:
            for name, body in POISON:
                if isinstance(body, bytes):
                    resp = client.post(
                        url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
                    )
                else:
                    resp = client.post(url + "/v1/chat/completions", json=body)
                poisoned[name] = resp.status_code

    threads = [threading.Thread(target=good, args=(i,)) for i in range(len(goods))]
    threads.append(threading.Thread(target=poison))
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == dict(enumerate(solo))
    assert all(400 <= status < 500 for status in poisoned.values()), [
        (k, v) for k, v in poisoned.items() if not 400 <= v < 500
    ]
    assert len(poisoned) == len(POISON)
    assert httpx.get(url + "/health").status_code == 200

    def idle() -> bool:
        text = httpx.get(url + "/metrics").text
        return _metric(text, "metrale:num_requests_running") == 0 and _metric(text, "metrale:num_requests_waiting") == 0

    assert _wait(idle)
    assert hostile[1].in_flight == 0
