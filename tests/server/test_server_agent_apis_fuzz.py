"""Malformed bodies for ``/v1/responses``, ``/v1/messages`` (+ ``count_tokens``) and
``/v1/embeddings``: every value of a rich valid body is replaced, in turn, by values of every
other JSON kind (and every key dropped); the server must answer each with a 2xx or a 4xx in that
API's own error shape, never a 5xx."""

from __future__ import annotations

import copy

import httpx
import pytest
from server_testlib import checkpoint_loader

import metrale_qwen3  # noqa: F401 -- a hard test dependency: missing is an error, not a skip
from metrale_core.testing.random_checkpoint import write_random_checkpoint

WRONG = [None, 0, -1, 2.5, "x", "", True, [], [1], {}, {"type": "x"}]

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}}
RESPONSES = {
    "model": "fz",
    "instructions": "Be brief.",
    "max_output_tokens": 3,
    "temperature": 0.5,
    "top_p": 0.9,
    "tool_choice": "auto",
    "reasoning": {"effort": "low"},
    "text": {"format": {"type": "text"}},
    "tools": [{"type": "function", "name": "f", "description": "d", "parameters": PARAMS}],
    "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
        {"role": "assistant", "content": "fine"},
        {"role": "user", "content": "go"},
    ],
}
MESSAGES = {
    "model": "fz",
    "max_tokens": 3,
    "system": [{"type": "text", "text": "Be brief."}],
    "temperature": 0.5,
    "top_p": 0.9,
    "top_k": 5,
    "stop_sequences": ["zz"],
    "tool_choice": {"type": "auto"},
    "thinking": {"type": "enabled", "budget_tokens": 2},
    "tools": [{"name": "f", "description": "d", "input_schema": PARAMS}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hm", "signature": ""},
                {"type": "tool_use", "id": "t1", "name": "f", "input": {"city": "P"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "ok"}]}],
        },
    ],
}
EMBEDDINGS = {"model": "fz", "input": ["hi there", "bye"], "encoding_format": "float"}


def _paths(value, path=()):
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, path + (i,))


#: Optional token limits: without them a (valid) request generates to the end of the context.
LIMITS = {("max_output_tokens",), ("max_tokens",)}


def _variants(body):
    for path in _paths(body):
        if not path:
            continue
        for wrong in WRONG + ["drop"]:
            if path in LIMITS and wrong in (None, "drop"):
                continue
            mutated = copy.deepcopy(body)
            parent = mutated
            for key in path[:-1]:
                parent = parent[key]
            if wrong == "drop":
                if isinstance(parent, dict):
                    del parent[path[-1]]
                else:
                    parent.pop(path[-1])
            else:
                parent[path[-1]] = wrong
            yield path, wrong, mutated


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory, start_server):
    from metrale_core.plugin.discovery import load_registry

    path = tmp_path_factory.mktemp("fuzz-qwen3")
    write_random_checkpoint(path, num_hidden_layers=1, max_position_embeddings=1024)
    server, _ = start_server(
        loader=checkpoint_loader(path, load_registry(), block_size=16, max_prefill_tokens=512), served_model_name="fz"
    )
    return server.url


@pytest.mark.parametrize(
    "route,body,shape",
    [
        ("/v1/responses", RESPONSES, "openai"),
        ("/v1/messages", MESSAGES, "anthropic"),
        (
            "/v1/messages/count_tokens",
            {
                k: v
                for k, v in MESSAGES.items()
                if k in ("model", "system", "tools", "tool_choice", "thinking", "messages")
            },
            "anthropic",
        ),
        ("/v1/embeddings", EMBEDDINGS, "openai"),
    ],
)
def test_no_malformed_body_is_a_5xx(fuzz_server, route, body, shape):
    with httpx.Client(base_url=fuzz_server, timeout=60) as http:
        assert http.post(route, json=body).status_code == 200, "the valid body must pass"
        statuses = {}
        for path, wrong, mutated in _variants(body):
            label = f"{'.'.join(map(str, path))}={wrong!r}"
            try:
                r = http.post(route, json=mutated)
            except httpx.TimeoutException:
                raise AssertionError(f"{label}: no answer in time") from None
            assert r.status_code < 500, (label, r.status_code, r.text)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            if r.status_code >= 400:
                data = r.json()
                if shape == "anthropic":
                    assert data["type"] == "error" and data["error"]["message"], (label, data)
                else:
                    assert set(data["error"]) == {"message", "type", "param", "code"}, (label, data)
    assert statuses.get(400, 0) > 20, statuses  # the mutations did reach the validation
