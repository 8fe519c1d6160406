"""Schema fuzz (schemathesis) against the server's own generated OpenAPI document.

Every documented operation (chat, completions, responses, messages, embeddings, tokenize, ...)
gets bounded, generated requests (valid and invalid bodies) through real uvicorn; the checks: no
5xx (``not_a_server_error``), every status documented for that operation
(``status_code_conformance``), the documented content types (``content_type_conformance``) and
every response body valid against the documented schema of its status
(``response_schema_conformance``).  Mismatches are collected over all operations and reported
together.  The server has a small context so generated ``max_tokens`` / ``n`` stay cheap.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from openapi_checks import Checked, documented_schema

MAX_EXAMPLES = 10


@pytest.fixture(scope="module")
def fuzz_server(start_server):
    return start_server(engine_options={"max_model_len": 96, "max_num_seqs": 8})


@pytest.fixture(scope="module")
def fuzz_url(fuzz_server):
    return fuzz_server[0].url


@pytest.fixture(scope="module")
def roomy_url(start_server):
    """A server with room for tool definitions in the prompt (the byte tokenizer is verbose)."""
    return start_server(engine_options={"max_model_len": 2048, "max_num_seqs": 8})[0].url


@pytest.fixture(scope="module")
def api_schema(fuzz_url):
    return documented_schema(fuzz_url, "scripted")


def _operations(schema) -> list:
    return [result.ok() for result in schema.get_all_operations()]


def test_generated_requests_get_documented_answers(api_schema, fuzz_url):
    from hypothesis import given

    operations = _operations(api_schema)
    assert {op.path for op in operations} >= {
        "/v1/chat/completions",
        "/v1/completions",
        "/tokenize",
        "/detokenize",
        "/v1/models",
        "/api/chat",
        "/api/generate",
        "/api/tags",
        "/api/show",
        "/api/embed",
    }
    checked = Checked()
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        def run(case):
            checked.call(case, fuzz_url)

        run()
    print(f"schema fuzz: {len(operations)} operations, answers by status {dict(sorted(checked.seen.items()))}")
    assert not checked.mismatches, "\n".join(checked.mismatches)
    # the fuzz reached the handlers: accepted requests and refused ones, and nothing else
    assert checked.seen.get(200, 0) > 0 and checked.seen.get(400, 0) > 0, checked.seen
    assert all(status < 500 for status in checked.seen), checked.seen


M = "scripted"
ASK = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
#: Requests each generating route must answer with a 200 whose body (or every streamed event)
#: matches the document: plain text, reasoning, tool calls, logprobs, n > 1 (embeddings: their own
#: test, on a model with hidden states).
VALID_BODIES: dict[str, list[dict]] = {
    "/v1/chat/completions": [
        {"model": M, "messages": ASK, "max_tokens": 12, "logprobs": True, "top_logprobs": 2, "n": 2},
        {"model": M, "messages": ASK, "max_tokens": 12, "stream": True, "stream_options": {"include_usage": True}},
        {"model": M, "messages": [{"role": "user", "content": "ponder"}], "max_tokens": 40},
        {"model": M, "messages": [{"role": "user", "content": "ponder"}], "max_tokens": 40, "stream": True},
        {"model": M, "messages": [{"role": "user", "content": "weather?"}], "tools": [WEATHER_TOOL]},
        {"model": M, "messages": [{"role": "user", "content": "weather?"}], "tools": [WEATHER_TOOL], "stream": True},
    ],
    "/v1/completions": [
        {"model": M, "prompt": "Once", "max_tokens": 8, "logprobs": 2},
        {"model": M, "prompt": "Once", "max_tokens": 8, "echo": True},
        {"model": M, "prompt": ["a", "b"], "max_tokens": 8, "stream": True},
    ],
    "/v1/responses": [
        {"model": M, "input": "What is the capital of France?", "max_output_tokens": 16},
        {"model": M, "input": "ponder", "max_output_tokens": 40, "stream": True},
        {"model": M, "input": "weather?", "tools": [{"type": "function", "name": "get_weather"}], "stream": True},
    ],
    "/v1/messages": [
        {"model": M, "max_tokens": 16, "messages": ASK},
        {"model": M, "max_tokens": 40, "messages": [{"role": "user", "content": "ponder"}], "stream": True},
        {
            "model": M,
            "max_tokens": 60,
            "messages": [{"role": "user", "content": "weather?"}],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
            "stream": True,
        },
    ],
    "/v1/messages/count_tokens": [{"model": M, "messages": ASK}],
    "/tokenize": [{"model": M, "prompt": "hello"}, {"model": M, "messages": ASK}],
    "/detokenize": [{"model": M, "tokens": [104, 105]}],
    "/api/chat": [
        {"model": M, "messages": ASK, "stream": False},
        {"model": M, "messages": ASK},
        {"model": M, "messages": [{"role": "user", "content": "ponder"}], "think": True},
        {"model": M, "messages": [{"role": "user", "content": "weather?"}], "tools": [WEATHER_TOOL]},
        {"model": M, "messages": [{"role": "user", "content": "weather?"}], "tools": [WEATHER_TOOL], "stream": False},
        {"model": M, "messages": []},
    ],
    "/api/generate": [
        {"model": M, "prompt": "capital", "stream": False, "options": {"num_predict": 8}},
        {"model": M, "prompt": "ponder", "think": True},
        {"model": M, "prompt": "", "stream": False},
    ],
    "/api/show": [{"model": M}],
}


def test_valid_requests_get_bodies_and_events_as_documented(api_schema, roomy_url):
    """Each generating route answers valid requests (whole and streamed) with 200s whose bodies, and
    every server-sent event, validate against the document's schemas."""
    checked = Checked()
    for path, bodies in VALID_BODIES.items():
        operation = api_schema[path]["POST"]
        for body in bodies:
            response = checked.call(operation.Case(body=body, media_type="application/json"), roomy_url)
            assert response.status_code == 200, (path, body, response.text[:300])
            ollama = path.startswith("/api/")  # Ollama streams NDJSON, by default
            if body.get("stream", ollama) and path != "/api/show":
                media = "application/x-ndjson" if ollama else "text/event-stream"
                assert response.headers["content-type"][0].startswith(media), (path, body)
    assert not checked.mismatches, "\n".join(checked.mismatches)


#: Valid ``POST /v1/responses`` bodies for the stateful run (the stateless fuzz above covers the
#: invalid ones): ``previous_response_id`` comes only from the ``ContinueConversation`` link.
RESPONSES_BODY = {
    "type": "object",
    "required": ["model", "input"],
    "additionalProperties": False,
    "properties": {
        "model": {"type": "string"},
        "input": {"enum": ["What is the capital of France?", "Please ponder 2+2.", "count"]},
        "max_output_tokens": {"type": "integer", "minimum": 1, "maximum": 8},
        "store": {"type": "boolean"},
        "stream": {"type": "boolean"},
    },
}


def test_stateful_responses_follow_the_documented_links(fuzz_url):
    """The Responses operations as a state machine over the document's links: a created response
    is read (``GetStoredResponse``), deleted (``DeleteStoredResponse``) or continued with
    ``previous_response_id`` (``ContinueConversation``); every answer on the way is checked
    against the document as in the stateless fuzz."""
    schema = documented_schema(fuzz_url, "scripted", bodies={"/v1/responses": RESPONSES_BODY})
    machine = schema.include(path_regex="^/v1/responses").as_state_machine()
    checked = Checked()
    steps: list[tuple[str, str, int, str | None]] = []

    class Responses(machine):  # type: ignore[misc, valid-type]
        def call(self, case, **kwargs):
            response = checked.call(case, fuzz_url)
            body = case.body if isinstance(case.body, dict) else {}
            steps.append((case.method, case.path, response.status_code, body.get("previous_response_id")))
            return response

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            pass  # checked.call validated it and collected any mismatch

    Responses.run(
        settings=settings(
            max_examples=25,
            stateful_step_count=4,
            deadline=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
    )
    assert not checked.mismatches, "\n".join(checked.mismatches)
    by_route = {(method, path, status) for method, path, status, _ in steps}
    assert ("POST", "/v1/responses", 200) in by_route, by_route
    assert ("GET", "/v1/responses/{response_id}", 200) in by_route, by_route
    assert ("DELETE", "/v1/responses/{response_id}", 200) in by_route, by_route
    continued = [status for method, _, status, previous in steps if method == "POST" and previous]
    assert 200 in continued, steps
