"""Bad input is an OpenAI-shaped 4xx (never a 5xx) and leaves the server healthy; auth, limits,
the loading state, the bounded queue, timeouts and graceful shutdown."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from server_testlib import API_KEY, stream_while_stopping, wait_ready

CHAT = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def chat(**changes):
    body = {**CHAT, **changes}
    return {k: v for k, v in body.items() if v is not ...}


#: (case id, method, path, content (dict -> JSON, bytes -> raw), headers, status, message part)
CASES = [
    ("malformed-json", "/v1/chat/completions", b'{"messages": [', None, 400, "not valid JSON"),
    ("not-an-object", "/v1/chat/completions", b"[1, 2]", None, 400, "must be a JSON object"),
    ("missing-messages", "/v1/chat/completions", chat(messages=...), None, 400, "messages: field required"),
    ("empty-messages", "/v1/chat/completions", chat(messages=[]), None, 400, "at least one"),
    (
        "bad-role",
        "/v1/chat/completions",
        chat(messages=[{"role": "user", "content": "a"}, {"role": "wizard", "content": "b"}]),
        None,
        400,
        "messages[1].role: must be one of system, developer, user, assistant, tool",
    ),
    (
        "role-not-string",
        "/v1/chat/completions",
        chat(messages=[{"role": 3, "content": "a"}]),
        None,
        400,
        "messages[0].role: must be a string",
    ),
    ("unknown-field", "/v1/chat/completions", chat(temprature=0.5), None, 400, "temprature: unknown field"),
    (
        "unknown-nested-field",
        "/v1/chat/completions",
        chat(messages=[{"role": "user", "content": "a", "colour": "red"}]),
        None,
        400,
        "messages[0].colour: unknown field",
    ),
    ("stream-not-bool", "/v1/chat/completions", chat(stream="yes"), None, 400, "stream: must be true or false"),
    (
        "temperature-range",
        "/v1/chat/completions",
        chat(temperature=3.5),
        None,
        400,
        "temperature: must be between 0 and 2",
    ),
    ("top-p-zero", "/v1/chat/completions", chat(top_p=0), None, 400, "top_p"),
    ("n-zero", "/v1/chat/completions", chat(n=0), None, 400, "n: must be between 1 and 128"),
    ("max-tokens-zero", "/v1/chat/completions", chat(max_tokens=0), None, 400, "max_tokens"),
    ("max-tokens-string", "/v1/chat/completions", chat(max_tokens="10"), None, 400, "max_tokens: must be an integer"),
    ("top-logprobs-range", "/v1/chat/completions", chat(logprobs=True, top_logprobs=50), None, 400, "top_logprobs"),
    ("top-logprobs-without-logprobs", "/v1/chat/completions", chat(top_logprobs=2), None, 400, "needs logprobs"),
    ("logit-bias-key", "/v1/chat/completions", chat(logit_bias={"abc": 1}), None, 400, "logit_bias.abc"),
    (
        "image-part",
        "/v1/chat/completions",
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]),
        None,
        400,
        "messages[0].content[0].type",
    ),
    (
        "tool-without-id",
        "/v1/chat/completions",
        chat(messages=[{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}]),
        None,
        400,
        "messages[1].tool_call_id",
    ),
    (
        "json-schema-format",
        "/v1/chat/completions",
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
        None,
        400,
        "response_format.json_schema.schema: required",
    ),
    ("tool-choice-bad", "/v1/chat/completions", chat(tool_choice="always"), None, 400, "tool_choice"),
    ("unknown-model", "/v1/chat/completions", chat(model="gpt-9"), None, 404, "does not exist"),
    ("too-long-for-context", "/v1/chat/completions", chat(max_tokens=100_000), None, 400, "maximum context length"),
    ("prompt-too-long", "/v1/completions", {"prompt": "x" * 4100, "max_tokens": 1}, None, 400, "leaves no room"),
    ("token-out-of-vocab", "/v1/completions", {"prompt": [1, 2, 99999]}, None, 400, "outside the vocabulary"),
    ("prompt-mixed", "/v1/completions", {"prompt": [1, "a"]}, None, 400, "prompt:"),
    ("suffix", "/v1/completions", {"prompt": "a", "suffix": "b"}, None, 400, "suffix"),
    (
        "wrong-content-type",
        "/v1/chat/completions",
        json.dumps(CHAT).encode(),
        {"content-type": "text/plain"},
        415,
        "must be JSON",
    ),
    (
        "form-content-type",
        "/v1/completions",
        b"prompt=hi",
        {"content-type": "application/x-www-form-urlencoded"},
        415,
        "must be JSON",
    ),
    (
        "oversized-body",
        "/v1/chat/completions",
        chat(messages=[{"role": "user", "content": "x" * 300_000}]),
        None,
        413,
        "too large",
    ),
    ("detokenize-out-of-vocab", "/detokenize", {"tokens": [5, 10**9]}, None, 400, "outside the vocabulary"),
    ("tokenize-both", "/tokenize", {"prompt": "a", "messages": CHAT["messages"]}, None, 400, "exactly one"),
    # issue 16: each of these was a 500 or a misleading message before
    (
        "surrogate-chat",
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
        None,
        400,
        "messages[0].content: contains a lone UTF-16 surrogate",
    ),
    (
        "surrogate-completions",
        "/v1/completions",
        b'{"prompt": "a\\ud800"}',
        None,
        400,
        "prompt: contains a lone UTF-16 surrogate",
    ),
    (
        "surrogate-tokenize",
        "/tokenize",
        b'{"prompt": "\\udfff"}',
        None,
        400,
        "prompt: contains a lone UTF-16 surrogate",
    ),
    (
        "deep-json",
        "/v1/chat/completions",
        b'{"messages": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
        None,
        400,
        "nested deeper",
    ),
    (
        "deep-template-kwargs",
        "/v1/chat/completions",
        chat(chat_template_kwargs=json.loads('{"a": ' * 900 + "1" + "}" * 900)),
        None,
        400,
        "nested deeper than 64",
    ),
    (
        "kwargs-template",
        "/v1/chat/completions",
        chat(chat_template_kwargs={"template": "x"}),
        None,
        400,
        "chat_template_kwargs.template",
    ),
    (
        "kwargs-self",
        "/v1/chat/completions",
        chat(chat_template_kwargs={"self": 1}),
        None,
        400,
        "chat_template_kwargs.self",
    ),
    (
        "tokenize-kwargs-agp",
        "/tokenize",
        {"messages": CHAT["messages"], "chat_template_kwargs": {"add_generation_prompt": False}},
        None,
        400,
        "chat_template_kwargs.add_generation_prompt",
    ),
    (
        "tokenize-kwargs-messages",
        "/tokenize",
        {"messages": CHAT["messages"], "chat_template_kwargs": {"messages": []}},
        None,
        400,
        "chat_template_kwargs.messages",
    ),
    (
        "tool-properties-list",
        "/v1/chat/completions",
        chat(
            tools=[
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"type": "object", "properties": ["city"]}},
                }
            ]
        ),
        None,
        400,
        "tools[0].function.parameters.properties: must be an object",
    ),
    (
        "logit-bias-oov",
        "/v1/chat/completions",
        chat(logit_bias={"99999999": 1}),
        None,
        400,
        "logit_bias.99999999: token id 99999999 is outside the model's vocabulary",
    ),
    ("logit-bias-negative", "/v1/chat/completions", chat(logit_bias={"-1": 1}), None, 400, "logit_bias.-1"),
    (
        "logit-bias-too-many",
        "/v1/chat/completions",
        chat(logit_bias={str(i): 1 for i in range(301)}),
        None,
        400,
        "at most 300 entries",
    ),
    ("stop-too-many", "/v1/completions", {"prompt": "a", "stop": ["s"] * 17}, None, 400, "at most 16 stop strings"),
    (
        "stop-too-long",
        "/v1/completions",
        {"prompt": "a", "stop": ["s" * 2000]},
        None,
        400,
        "stop[0]: at most 1024 characters",
    ),
    (
        "text-part-without-text",
        "/v1/chat/completions",
        chat(messages=[{"role": "user", "content": [{"type": "text"}]}]),
        None,
        400,
        "messages[0].content[0].text: required for a 'text' content part",
    ),
    (
        "content-part-string",
        "/v1/chat/completions",
        chat(messages=[{"role": "user", "content": ["hi"]}]),
        None,
        400,
        "messages[0].content[0]: must be an object, got a string",
    ),
    (
        "stream-options-string",
        "/v1/chat/completions",
        chat(stream_options="yes"),
        None,
        400,
        "stream_options: must be an object, got a string",
    ),
    (
        "batch-beyond-capacity",
        "/v1/completions",
        {"prompt": ["a"] * 300, "max_tokens": 1},
        None,
        400,
        "more than this server ever admits at once (288",
    ),
    (
        "prompt-chars-early",
        "/v1/completions",
        {"prompt": "x" * 200_000},
        None,
        400,
        "characters, more than this model's context",
    ),
    ("unsupported-route", "/v1/images/generations", {"prompt": "a"}, None, 501, "not implemented"),
    ("unknown-route", "/v1/nothing-here", {}, None, 404, "no route"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_error_table(small_body_server, case):
    _, path, content, headers, status, part = case
    url = small_body_server[0].url
    if isinstance(content, dict):
        resp = httpx.post(url + path, json=content, headers=headers, timeout=30)
    else:
        resp = httpx.post(
            url + path, content=content, headers=headers or {"content-type": "application/json"}, timeout=30
        )
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert part in error["message"]
    assert httpx.get(url + "/health").status_code == 200


def test_method_not_allowed_is_openai_shaped(base_url):
    resp = httpx.get(base_url + "/v1/chat/completions")
    assert resp.status_code == 405 and "not allowed" in resp.json()["error"]["message"]


def test_error_param_names_the_path(base_url):
    resp = httpx.post(
        base_url + "/v1/chat/completions", json=chat(messages=[{"role": "user", "content": "a"}, {"role": "x"}])
    )
    assert resp.json()["error"]["param"] == "messages[1].role"


@pytest.fixture(scope="module")
def small_body_server(start_server):
    return start_server(max_body_bytes=256 * 1024)


def test_api_key_required_and_compared(start_server):
    server, _ = start_server(api_key=API_KEY)
    url = server.url
    denied = httpx.post(url + "/v1/chat/completions", json=CHAT)
    assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"
    wrong = httpx.post(url + "/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer sk-wrong"})
    assert wrong.status_code == 401
    assert httpx.get(url + "/v1/models").status_code == 401
    ok = httpx.post(url + "/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {API_KEY}"})
    assert ok.status_code == 200
    assert httpx.get(url + "/health").status_code == 200  # probes stay open


def test_health_is_503_while_loading_then_200(start_server, byte_tokenizer):
    from server_testlib import ScriptedLM

    from metrale_core.engine import EngineConfig, LLMEngine
    from metrale_core.server import ServedModel

    gate = threading.Event()
    loaded_on = []

    def slow_loader():
        loaded_on.append(threading.current_thread())
        gate.wait(30)
        engine = LLMEngine(ScriptedLM(byte_tokenizer), EngineConfig(num_kv_blocks=64), tokenizer=byte_tokenizer)
        return ServedModel(engine=engine, tokenizer=byte_tokenizer)

    from metrale_core.server import ServerConfig, create_app, serve_in_thread

    app = create_app(ServerConfig(served_model_name="scripted"), slow_loader)
    server = serve_in_thread(app)
    try:
        health = httpx.get(server.url + "/health")
        assert health.status_code == 503
        assert health.json()["error"]["code"] == "model_not_loaded"
        busy = httpx.post(server.url + "/v1/chat/completions", json=CHAT)
        assert busy.status_code == 503 and "Retry-After" in busy.headers
        assert httpx.get(server.url + "/v1/models").status_code == 200
        gate.set()
        wait_ready(server.url)
        assert httpx.post(server.url + "/v1/chat/completions", json=CHAT).status_code == 200
        # the loader ran on a thread of its own that is gone now (no pooled executor thread
        # keeps an OpenMP team alive next to the engine thread)
        assert loaded_on[0].name == "metrale-loader"
        loaded_on[0].join(5)
        assert not loaded_on[0].is_alive() and loaded_on[0] is not threading.main_thread()
    finally:
        gate.set()
        server.stop()


def test_failed_load_stays_503_with_the_reason():
    from metrale_core.errors import WeightsError
    from metrale_core.server import ServerConfig, create_app, serve_in_thread

    def broken():
        raise WeightsError("model.safetensors is truncated")

    app = create_app(ServerConfig(served_model_name="x"), broken)
    server = serve_in_thread(app)
    try:
        for _ in range(200):
            resp = httpx.get(server.url + "/health")
            if resp.json()["error"]["code"] == "model_load_failed":
                break
            threading.Event().wait(0.01)
        assert resp.status_code == 503 and "WeightsError" in resp.json()["error"]["message"]
    finally:
        server.stop()


def test_full_queue_is_503_with_retry_after(start_server):
    server, host = start_server(max_waiting=0, engine_options={"max_num_seqs": 1})
    url = server.url
    long = {"prompt": "abc", "max_tokens": 3000, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", url + "/v1/completions", json=long, timeout=60) as stream:
        lines = stream.iter_lines()
        assert next(lines).startswith("data: ")
        assert host.in_flight == 1
        resp = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert resp.status_code == 503
        assert resp.headers["Retry-After"] == "1"
        assert resp.json()["error"]["code"] == "queue_full"
    for _ in range(500):
        if host.in_flight == 0:
            break
        threading.Event().wait(0.01)
    assert httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200


def test_graceful_shutdown_finishes_in_flight_streams(start_server):
    server, host = start_server()
    rest = stream_while_stopping(server, max_tokens=200)
    assert rest[-1] == "data: [DONE]"
    assert '"finish_reason":"length"' in rest[-2]
    assert not server.thread.is_alive()
    assert not host.async_engine.is_running and host.status == "stopping"
