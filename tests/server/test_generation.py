"""Each engine request is validated once, under its real id (issue 34): the server builds the
engine's checked ``EngineRequest`` with one ``LLMEngine.validate_request`` call per choice, and
the engine queues exactly those records without checking them again.

A random Qwen3 checkpoint (the real loader, the byte tokenizer, the installed plugins: the
structured-output one included) served by real uvicorn; ``LLMEngine.validate_request`` and
``LLMEngine.add_request`` are wrapped to record the ids they see."""

from __future__ import annotations

import threading
from collections import Counter

import httpx
import pytest
from server_testlib import ScriptedLM, checkpoint_loader, scripted_served

import metrale_qwen3  # noqa: F401 -- a hard test dependency: missing is an error, not a skip
import metrale_structured  # noqa: F401 -- the structured-output case needs it
from metrale_core.engine import LLMEngine
from metrale_core.engine.request import EngineRequest
from metrale_core.testing.random_checkpoint import write_random_checkpoint

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}


@pytest.fixture(scope="module")
def served(tmp_path_factory, start_server):
    from metrale_core.plugin.discovery import load_registry

    path = tmp_path_factory.mktemp("once-qwen3")
    write_random_checkpoint(path, intermediate_size=48, num_hidden_layers=1, max_position_embeddings=256)
    server, _ = start_server(loader=checkpoint_loader(path, load_registry()), served_model_name="tiny")
    return server.url


@pytest.fixture
def seen(monkeypatch):
    """``(validated, added)``: Counters of the request ids ``validate_request`` checked and of
    the ids ``add_request`` queued as ``EngineRequest`` records (anything else it got counts
    under ``"<unchecked>"``)."""
    validated: Counter = Counter()
    added: Counter = Counter()
    lock = threading.Lock()
    validate, add = LLMEngine.validate_request, LLMEngine.add_request

    def counting_validate(self, request_id, *args, **kwargs):
        with lock:
            validated[request_id] += 1
        return validate(self, request_id, *args, **kwargs)

    def counting_add(self, request, *args, **kwargs):
        with lock:
            added[request.request_id if isinstance(request, EngineRequest) else "<unchecked>"] += 1
        return add(self, request, *args, **kwargs)

    monkeypatch.setattr(LLMEngine, "validate_request", counting_validate)
    monkeypatch.setattr(LLMEngine, "add_request", counting_add)
    return validated, added


def _post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=120)


def _assert_once(seen, requests: int) -> None:
    validated, added = seen
    assert len(validated) == requests, validated
    assert set(validated.values()) == {1}, validated  # each id checked once
    assert dict(added) == dict(validated)  # ... and those very records queued, nothing else
    assert "validate" not in validated  # no stand-in id


def test_chat_is_validated_once(served, seen):
    r = _post(served, "/v1/chat/completions", CHAT)
    assert r.status_code == 200, r.text
    _assert_once(seen, 1)


def test_completions_n_choices_of_several_prompts_are_validated_once_each(served, seen):
    r = _post(served, "/v1/completions", {"model": "tiny", "prompt": ["ab", "cd", "ef"], "n": 2, "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 6
    _assert_once(seen, 6)


def test_streamed_chat_is_validated_once(served, seen):
    with httpx.stream("POST", served + "/v1/chat/completions", json={**CHAT, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        assert r.read().decode().rstrip().endswith("data: [DONE]")
    _assert_once(seen, 1)


def test_embeddings_are_validated_once_per_input(served, seen):
    r = _post(served, "/v1/embeddings", {"model": "tiny", "input": ["one", "two", "three"]})
    assert r.status_code == 200, r.text
    assert len(r.json()["data"]) == 3
    _assert_once(seen, 3)


def test_a_structured_output_request_is_validated_once(served, seen):
    body = {**CHAT, "max_tokens": 4, "structured_outputs": {"regex": "[0-9]+"}}
    r = _post(served, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["message"]["content"]
    assert text.isdigit(), text  # the constraint ran: the record reached the processor intact
    _assert_once(seen, 1)


def test_a_refused_request_is_validated_once_and_never_queued(served, seen):
    r = _post(served, "/v1/completions", {"model": "tiny", "prompt": [1, 2, 99999], "max_tokens": 2})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "prompt"
    assert error["message"].startswith("token id 99999 is outside the vocabulary [0, ")
    assert not error["message"].startswith("request ")  # the engine's id prefix is not shown
    validated, added = seen
    assert sum(validated.values()) == 1
    assert not added


def test_a_refused_grammar_is_a_400_naming_the_field_validated_once(served, seen):
    body = {**CHAT, "structured_outputs": {"grammar": "root ::= (("}}
    r = _post(served, "/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith("structured_outputs")
    validated, added = seen
    assert sum(validated.values()) == 1
    assert not added


class _BoomLM(ScriptedLM):
    """The scripted model whose forward raises for any prompt that contains "boom"."""

    def _logits(self, history):
        if "boom" in self.tokenizer.decode(history, skip_special_tokens=False):
            raise RuntimeError("the accelerator caught fire")
        return super()._logits(history)


@pytest.fixture(scope="module")
def booming(start_server, byte_tokenizer):
    server, host = start_server(loader=lambda: scripted_served(byte_tokenizer, model_class=_BoomLM))
    return server.url, host


@pytest.mark.parametrize("route", ["chat", "completions"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_request_the_engine_fails_releases_its_admission(booming, route, stream):
    """The route ends the planned stream when the engine's failure reaches it, so the request
    stops counting as in flight (a leak kept shutdown waiting on it and aborting)."""
    url, host = booming
    body = {"model": "scripted", "max_tokens": 4, "stream": stream}
    if route == "chat":
        body["messages"] = [{"role": "user", "content": "boom"}]
    else:
        body["prompt"] = "boom"
    resp = httpx.post(f"{url}/v1/{'chat/completions' if route == 'chat' else 'completions'}", json=body, timeout=60)
    if stream:
        assert resp.status_code == 200 and "the accelerator caught fire" in resp.text
    else:
        assert resp.status_code == 500 and "the accelerator caught fire" in resp.text
    released = threading.Event()
    for _ in range(500):  # the response is sent before its handler's last line runs: wait for it
        if host.in_flight == 0:
            released.set()
            break
        released.wait(0.01)
    assert released.is_set(), f"{host.in_flight} request(s) still counted in flight"
