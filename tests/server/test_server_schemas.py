"""Request validation without a server: strict JSON types, unknown fields by path, ranges,
the documented OpenAI fields accepted, and the OpenAPI body schema derived from the models."""

from __future__ import annotations

import json

import pytest

from metrale_core.server.errors import APIError
from metrale_core.server.openapi import json_schema
from metrale_core.server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    check_ranges,
    parse_body,
)


def parse(cls, body):
    req = parse_body(json.dumps(body).encode(), cls)
    check_ranges(req)
    return req


def error_of(cls, body) -> APIError:
    with pytest.raises(APIError) as info:
        parse(cls, body)
    assert info.value.status == 400
    return info.value


def test_every_field_the_openai_client_sends_is_accepted():
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "bob"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ],
        "frequency_penalty": 0.5,
        "presence_penalty": -0.5,
        "logit_bias": {"12": -100},
        "logprobs": True,
        "top_logprobs": 3,
        "max_tokens": 10,
        "max_completion_tokens": 10,
        "n": 2,
        "seed": 1,
        "stop": ["x"],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.2,
        "top_p": 0.9,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "user": "u",
        "store": False,
        "metadata": {"a": "b"},
        "service_tier": "auto",
        "reasoning_effort": "low",
        "response_format": {"type": "text"},
        "chat_template_kwargs": {"enable_thinking": False},
        "top_k": 5,
        "min_p": 0.1,
        "repetition_penalty": 1.1,
        "stop_token_ids": [3],
    }
    req = parse(ChatCompletionRequest, body)
    assert req.n == 2 and req.stream_options.include_usage and req.logit_bias == {"12": -100.0}
    assert req.messages[3].tool_call_id == "c1"


def test_nulls_mean_defaults():
    req = parse(
        ChatCompletionRequest,
        {"messages": [{"role": "user", "content": "a"}], "n": None, "stream": None, "temperature": None},
    )
    assert req.n == 1 and req.stream is False and req.temperature is None


@pytest.mark.parametrize(
    "body, message",
    [
        (
            {"messages": [{"role": "user", "content": 5}]},
            "messages[0].content: must be a string or an array of content parts, got a number",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "txt": "a"}]}]},
            "messages[0].content[0].txt: unknown field",
        ),
        ({"messages": [{"role": "user", "content": "a"}], "n": True}, "n: must be an integer"),
        (
            {"messages": [{"role": "user", "content": "a"}], "temperature": "0.5"},
            "temperature: must be a number, got a string",
        ),
        (
            {"messages": [{"role": "user", "content": "a"}], "stop": ["a", "b"] + [None]},
            "stop[2]: must be a string, got null",
        ),
        (
            {"messages": [{"role": "user", "content": "a"}], "stream_options": {"usage": True}},
            "stream_options.usage: unknown field",
        ),
        (
            {"messages": [{"role": "user", "content": "a"}], "frequency_penalty": 2.5},
            "frequency_penalty: must be between -2 and 2, got 2.5",
        ),
        (
            {"messages": [{"role": "user", "content": "a"}], "logit_bias": {"1": 500}},
            "logit_bias.1: must be between -100 and 100",
        ),
    ],
)
def test_errors_name_their_path(body, message):
    assert message in error_of(ChatCompletionRequest, body).message


def test_completion_prompt_shapes():
    assert parse(CompletionRequest, {"prompt": [[1, 2], [3]]}).prompt == [[1, 2], [3]]
    assert "prompt" in error_of(CompletionRequest, {"prompt": []}).message
    assert "logprobs: must be between 0 and 20" in error_of(CompletionRequest, {"prompt": "a", "logprobs": 21}).message


def test_openapi_schema_comes_from_the_models():
    schema = json_schema(ChatCompletionRequest).to_schema()
    assert schema["required"] == ["messages"]
    assert schema["properties"]["messages"]["items"]["properties"]["role"]["type"] == "string"
    assert "stream_options" in schema["properties"]
