"""The Ollama API (``/api/*``) with the official ``ollama`` client on a real uvicorn server (the
scripted model: text, thinking, tool calls; a random Qwen3 for embeddings), raw NDJSON lines,
options mapped onto sampling, ``format`` validated with ``jsonschema``, Ollama's error shape and
statuses, bearer auth, and a disconnecting stream that leaves the others whole."""

from __future__ import annotations

import json
import threading

import httpx
import jsonschema
import numpy as np
import ollama
import pytest
from server_testlib import API_KEY, WEATHER_CALL, checkpoint_loader

from metrale_core.testing.tools import weather_tool

M = "scripted"
CAPITAL = "The capital of France is Paris."
WEATHER_TOOL = weather_tool("Weather of a city")


@pytest.fixture(scope="module")
def oclient(base_url):
    return ollama.Client(host=base_url, timeout=60)


def _ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _lines(response: httpx.Response) -> list[dict]:
    return [json.loads(line) for line in response.text.splitlines() if line.strip()]


def test_chat_whole_and_streamed_agree(oclient):
    whole = oclient.chat(model=M, messages=_ask("What is the capital of France?"))
    assert whole.message.role == "assistant" and whole.message.content == CAPITAL
    assert whole.done and whole.done_reason == "stop" and whole.model == M
    assert whole.prompt_eval_count > 0 and whole.eval_count == len(CAPITAL) + 1  # bytes + EOS
    assert whole.total_duration >= whole.eval_duration >= 0
    parts = list(oclient.chat(model=f"{M}:latest", messages=_ask("What is the capital of France?"), stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done and parts[-1].done_reason == "stop"
    assert "".join(p.message.content for p in parts) == CAPITAL
    assert len(parts) > 2 and parts[-1].model == f"{M}:latest"


def test_chat_stream_lines_are_ndjson(base_url):
    body = {"model": M, "messages": _ask("What is the capital of France?")}  # stream defaults to true
    r = httpx.post(base_url + "/api/chat", json=body, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    lines = _lines(r)
    assert [line["done"] for line in lines] == [False] * (len(lines) - 1) + [True]
    assert all(line["created_at"].endswith("Z") and line["model"] == M for line in lines)
    final = lines[-1]
    assert {"total_duration", "prompt_eval_count", "eval_count", "eval_duration"} <= set(final)


def test_every_stream_line_matches_the_openapi_document(base_url):
    """Each NDJSON line (text, thinking, tool calls, the final line) validates against the
    document's ``application/x-ndjson`` schema of its route (schemathesis checks the whole
    bodies; it does not read NDJSON)."""
    document = httpx.get(base_url + "/schema/openapi.json", timeout=30).json()
    asks = {
        "/api/chat": [
            {"messages": _ask("What is the capital of France?")},
            {"messages": _ask("ponder"), "think": True},
            {"messages": _ask("weather?"), "tools": [WEATHER_TOOL]},
        ],
        "/api/generate": [{"prompt": "capital"}, {"prompt": "ponder", "think": True}, {"prompt": ""}],
    }
    for path, bodies in asks.items():
        content = document["paths"][path]["post"]["responses"]["200"]["content"]
        validator = jsonschema.Draft202012Validator(content["application/x-ndjson"]["schema"])
        for body in bodies:
            r = httpx.post(base_url + path, json={"model": M, **body}, timeout=60)
            assert r.headers["content-type"].startswith("application/x-ndjson"), r.headers
            for line in _lines(r):
                errors = [e.message for e in validator.iter_errors(line)]
                assert not errors, (path, body, line, errors)


def test_generate_whole_streamed_system_and_raw(oclient, base_url):
    whole = oclient.generate(model=M, prompt="What is the capital of France?")
    assert whole.response == CAPITAL and whole.done_reason == "stop"
    streamed = list(oclient.generate(model=M, prompt="What is the capital of France?", stream=True))
    assert "".join(p.response for p in streamed) == CAPITAL and streamed[-1].done
    with_system = oclient.generate(model=M, prompt="What is the capital of France?", system="Be brief.")
    assert with_system.response == CAPITAL and with_system.prompt_eval_count > whole.prompt_eval_count
    # raw: the prompt is sent as is, so the scripted model sees no assistant header and samples
    raw = oclient.generate(model=M, prompt="capital", raw=True, options={"num_predict": 5, "seed": 1})
    assert raw.prompt_eval_count == len("capital") and raw.eval_count == 5 and raw.done_reason == "length"


def test_empty_prompt_or_messages_load_the_model(oclient):
    loaded = oclient.generate(model=M, prompt="")
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""
    assert oclient.chat(model=M, messages=[]).done_reason == "load"


def test_think_splits_reasoning_into_thinking(oclient):
    r = oclient.chat(model=M, messages=_ask("ponder 2+2"), think=True)
    assert r.message.thinking.strip() == "Two and two make four."
    assert r.message.content.strip() == "The answer is 4."
    parts = list(oclient.generate(model=M, prompt="ponder 2+2", think=True, stream=True))
    assert "".join(p.thinking or "" for p in parts).strip() == "Two and two make four."
    assert "".join(p.response for p in parts).strip() == "The answer is 4."


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_round_trip(oclient, stream):
    kwargs = dict(model=M, messages=_ask("What is the weather in Paris?"), tools=[WEATHER_TOOL])
    if stream:
        parts = list(oclient.chat(stream=True, **kwargs))
        calls = [c for p in parts for c in p.message.tool_calls or ()]
        assert "".join(p.message.content for p in parts) == ""
    else:
        calls = oclient.chat(**kwargs).message.tool_calls
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    history = [
        *_ask("What is the weather in Paris?"),
        {"role": "assistant", "content": "", "tool_calls": [c.model_dump() for c in calls]},
        {"role": "tool", "content": "sunny, 24 C", "tool_name": "get_weather"},
    ]
    # the history renders the call with its object arguments as JSON; the tool result answers it
    answer = oclient.chat(model=M, messages=history, tools=[WEATHER_TOOL])
    assert answer.message.content == "It is sunny in Paris." and not answer.message.tool_calls
    assert WEATHER_CALL  # the scripted reply the call came from


def test_options_map_to_sampling(oclient):
    ask = _ask("tell me something")  # no scripted reply: the model samples
    capped = oclient.chat(model=M, messages=ask, options={"num_predict": 7, "temperature": 0})
    assert capped.done_reason == "length" and capped.eval_count == 7
    seeded = [
        oclient.chat(model=M, messages=ask, options={"num_predict": 12, "seed": 42, "temperature": 1.0}).message.content
        for _ in range(2)
    ]
    other = oclient.chat(model=M, messages=ask, options={"num_predict": 12, "seed": 7, "temperature": 1.0})
    assert seeded[0] == seeded[1] != other.message.content
    stopped = oclient.chat(
        model=M, messages=_ask("count"), options={"stop": ["four"], "num_ctx": 4096, "num_gpu": 0, "unknown": 1}
    )
    assert stopped.message.content == "one two three " and stopped.done_reason == "stop"


def test_format_json_and_schema_are_enforced(oclient):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer", "maximum": 9}},
        "required": ["city", "days"],
        "additionalProperties": False,
    }
    # think=False: a reasoning model may otherwise think (unconstrained) before the JSON
    r = oclient.chat(model=M, messages=_ask("a record"), format=schema, think=False, options={"num_predict": 120})
    assert r.done_reason == "stop", r
    jsonschema.validate(json.loads(r.message.content), schema)
    g = oclient.generate(
        model=M, prompt="a record", format="json", think=False, options={"num_predict": 200, "seed": 3}
    )
    if g.done_reason == "stop":  # a random model may fill the budget inside an open string
        assert isinstance(json.loads(g.response), dict)
    else:
        assert g.response.lstrip().startswith("{")


def test_tags_show_ps_version(oclient, base_url):
    tags = oclient.list()
    assert [m.model for m in tags.models] == [f"{M}:latest"]
    assert tags.models[0].digest and tags.models[0].details.family
    shown = oclient.show(M)
    assert "completion" in shown.capabilities and "thinking" in shown.capabilities and "tools" in shown.capabilities
    assert shown.template and shown.modelinfo
    running = oclient.ps()
    assert [m.model for m in running.models] == [f"{M}:latest"]
    version = httpx.get(base_url + "/api/version", timeout=10).json()
    assert version["version"].count(".") == 2 and "metrale" in version


def test_unknown_model_and_bad_input_are_ollama_errors(oclient, base_url):
    with pytest.raises(ollama.ResponseError) as info:
        oclient.chat(model="llama3.2", messages=_ask("hi"))
    assert info.value.status_code == 404 and 'model "llama3.2" not found' in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        oclient.show("llama3.2")
    assert info.value.status_code == 404
    bad = [
        ("/api/chat", {"messages": _ask("hi"), "options": {"temperature": "hot"}}, "options.temperature"),
        ("/api/chat", {"messages": _ask("hi"), "options": {"temperature": 9}}, "options.temperature"),
        ("/api/chat", {"messages": _ask("hi"), "options": {"num_predict": 0}}, "options.num_predict"),
        ("/api/chat", {"messages": _ask("hi"), "options": {"top_p": 0}}, "options.top_p"),
        ("/api/chat", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "messages[0].images"),
        ("/api/chat", {"messages": _ask("hi"), "format": "yaml"}, "format"),
        ("/api/chat", {"messages": _ask("hi"), "format": {"type": "nonsense"}}, "format"),
        ("/api/chat", {"messages": _ask("hi"), "think": "very"}, "think"),
        ("/api/chat", {"messages": _ask("hi"), "tools": [{"type": "function"}]}, "tools[0]"),
        ("/api/chat", {"messages": _ask("hi"), "bogus": 1}, "bogus"),
        ("/api/generate", {"prompt": "x", "suffix": "y"}, "suffix"),
        ("/api/generate", {"prompt": "x", "context": [1, 2]}, "context"),
        ("/api/generate", {"prompt": "x", "images": ["aGk="]}, "images"),
        ("/api/embed", {}, "input"),
    ]
    for path, body, field in bad:
        r = httpx.post(base_url + path, json={"model": M, **body}, timeout=30)
        assert r.status_code == 400, (path, body, r.status_code, r.text)
        assert set(r.json()) == {"error"} and field in r.json()["error"], (path, r.json())
    r = httpx.post(base_url + "/api/chat", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and set(r.json()) == {"error"}


def test_model_store_routes_say_what_to_do(oclient):
    assert oclient.pull(M).status == "success"  # the served model is here
    refused = [
        (404, lambda: oclient.pull("llama3.2")),
        (403, lambda: oclient.delete(M)),
        (403, lambda: oclient.copy(M, "x")),
    ]
    for status, call in refused:
        with pytest.raises(ollama.ResponseError) as info:
            call()
        assert info.value.status_code == status and "met serve ORG/NAME" in info.value.error


def test_api_key_is_required_when_set(start_server):
    secured, _ = start_server(api_key=API_KEY)
    with pytest.raises(ollama.ResponseError) as info:
        ollama.Client(host=secured.url).list()
    assert info.value.status_code == 401 and "API key" in info.value.error
    keyed = ollama.Client(host=secured.url, headers={"Authorization": f"Bearer {API_KEY}"})
    assert keyed.chat(model=M, messages=_ask("capital?")).message.content == CAPITAL


def test_a_dropped_stream_does_not_hurt_the_others(base_url, oclient):
    started = threading.Event()

    def drop() -> None:
        body = {"model": M, "messages": _ask("tell me a long story"), "options": {"num_predict": 4000}}
        with httpx.stream("POST", base_url + "/api/chat", json=body, timeout=60) as r:
            for _ in r.iter_lines():
                started.set()
                break  # leave mid-stream

    dropper = threading.Thread(target=drop)
    dropper.start()
    assert started.wait(60)
    answers = [oclient.chat(model=M, messages=_ask("What is the capital of France?")) for _ in range(3)]
    dropper.join(60)
    assert [a.message.content for a in answers] == [CAPITAL] * 3


@pytest.fixture(scope="module")
def embedder(tiny_qwen3, start_server):
    from metrale_core.plugin.discovery import load_registry

    server, _ = start_server(loader=checkpoint_loader(tiny_qwen3, load_registry()), served_model_name="tiny")
    return server.url


def test_embed_matches_the_openai_route(embedder):
    client = ollama.Client(host=embedder, timeout=60)
    texts = ["The quick brown fox", "jumps over the lazy dog"]
    got = client.embed(model="tiny", input=texts)
    want = httpx.post(embedder + "/v1/embeddings", json={"model": "tiny", "input": texts}, timeout=60).json()
    assert len(got.embeddings) == 2 and got.prompt_eval_count > 0
    for vector, item in zip(got.embeddings, want["data"], strict=True):
        assert np.abs(np.asarray(vector) - np.asarray(item["embedding"])).max() <= 1e-6
        assert abs(np.linalg.norm(vector) - 1.0) <= 1e-5
    single = client.embed(model="tiny:latest", input=texts[0]).embeddings
    legacy = client.embeddings(model="tiny", prompt=texts[0]).embedding
    assert np.abs(np.asarray(single[0]) - np.asarray(legacy)).max() <= 1e-6
    assert "embedding" in client.show("tiny").capabilities
    assert client.list().models[0].size > 0  # the bytes of its tensors
