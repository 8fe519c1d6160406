"""``decode.parse_body``: one strict msgspec decode for a valid body, the API's two leniencies
(top-level null = default, ``2.0`` = 2) on the slow path, and 400s naming the path."""

from __future__ import annotations

import json

import msgspec
import pytest

from metrale_core.server import decode
from metrale_core.server.decode import parse_body
from metrale_core.server.errors import APIError
from metrale_core.server.messages.records import MessagesRequest
from metrale_core.server.ollama.records import OllamaChatRequest
from metrale_core.server.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest

ASK = [{"role": "user", "content": "hi"}]


def parse(cls, body):
    return parse_body(json.dumps(body).encode(), cls)


def error(cls, body) -> APIError:
    with pytest.raises(APIError) as info:
        parse_body(body if isinstance(body, bytes) else json.dumps(body).encode(), cls)
    assert info.value.status == 400
    return info.value


@pytest.fixture
def counted(monkeypatch):
    """How often bodies are decoded strictly, and how often the slow path parses them again."""
    counts = {"decode": 0, "slow": 0}
    strict = decode._decoder

    class Counting:
        def __init__(self, cls):
            self.inner = strict(cls)

        def decode(self, body):
            counts["decode"] += 1
            return self.inner.decode(body)

    plain = decode._plain

    def counting_plain(body):
        counts["slow"] += 1
        return plain(body)

    monkeypatch.setattr(decode, "_decoder", Counting)
    monkeypatch.setattr(decode, "_plain", counting_plain)
    return counts


def test_a_valid_body_is_decoded_once(counted):
    req = parse(ChatCompletionRequest, {"messages": ASK, "n": 2, "temperature": 0.5, "stop": ["x"]})
    assert isinstance(req, ChatCompletionRequest) and req.n == 2 and req.stop == ["x"]
    assert counted == {"decode": 1, "slow": 0}


def test_leniencies_take_the_slow_path_once(counted):
    req = parse(ChatCompletionRequest, {"messages": ASK, "n": 2.0, "max_tokens": None, "stop_token_ids": [3.0, 4]})
    assert req.n == 2 and type(req.n) is int and req.max_tokens is None
    assert req.stop_token_ids == [3, 4] and all(type(t) is int for t in req.stop_token_ids)
    assert counted == {"decode": 1, "slow": 1}


def test_integral_floats_become_ints_only_where_the_record_wants_an_integer():
    req = parse(CompletionRequest, {"prompt": [[1.0, 2], [3]], "temperature": 1, "n": 1.0})
    assert req.prompt == [[1, 2], [3]] and type(req.prompt[0][0]) is int
    assert req.temperature == 1.0 and type(req.temperature) is float
    kwargs = parse(ChatCompletionRequest, {"messages": ASK, "n": 1.0, "chat_template_kwargs": {"x": 2.0}})
    assert type(kwargs.chat_template_kwargs["x"]) is float  # free-form JSON is left as sent


@pytest.mark.parametrize(
    "body, message, param",
    [
        ({"messages": ASK, "n": 2.5}, "n: must be an integer, got a number", "n"),
        ({"messages": ASK, "n": "2"}, "n: must be an integer, got a string", "n"),
        ({"messages": ASK, "temperature": True}, "temperature: must be a number, got a boolean", "temperature"),
        ({"messages": ASK, "tool_choice": 3}, "tool_choice: must be 'none', 'auto', 'required' or {", "tool_choice"),
        ({"messages": [{"content": "a"}]}, "messages[0].role: field required", "messages[0].role"),
        ({"messages": ASK, "stop_token_ids": [1, 2.5]}, "stop_token_ids[1]: must be an integer", "stop_token_ids[1]"),
        ({"messages": ASK, "logit_bias": {"5": "x"}}, "logit_bias[...]: must be a number, got a string", None),
    ],
)
def test_errors_name_their_path(body, message, param):
    exc = error(ChatCompletionRequest, body)
    assert message in exc.message
    if param is not None:
        assert exc.param == param


def test_a_null_inside_the_body_is_not_a_default():
    assert (
        "messages[0].role: must be a string, got null"
        in error(ChatCompletionRequest, {"messages": [{"role": None}]}).message
    )


def test_prompt_items_are_of_one_kind():
    assert "mixed or empty items" in error(CompletionRequest, {"prompt": [1, "a"]}).message
    assert "mixed or empty items" in error(CompletionRequest, {"prompt": [[1], []]}).message
    assert error(EmbeddingRequest, {"input": []}).param == "input"
    assert parse(EmbeddingRequest, {"input": ["a", "b"]}).input == ["a", "b"]


def test_json_faults():
    assert "not valid JSON" in error(ChatCompletionRequest, b'{"messages": [').message
    assert "must be a JSON object, got an array" in error(ChatCompletionRequest, b"[1]").message
    assert (
        "nested deeper than 64"
        in error(ChatCompletionRequest, b'{"metadata": ' + b"[" * 100 + b"]" * 100 + b"}").message
    )
    surrogate = error(ChatCompletionRequest, b'{"messages": [{"role": "user", "content": "a\\ud800"}]}')
    assert surrogate.param == "messages[0].content"


def test_the_depth_guard_walks_the_decoded_record():
    """Free-form JSON (``chat_template_kwargs``) decodes, then the guard counts its depth."""
    deep = json.loads('{"a": ' * 70 + "1" + "}" * 70)
    exc = error(ChatCompletionRequest, {"messages": ASK, "chat_template_kwargs": deep})
    assert "nested deeper than 64" in exc.message and exc.param.startswith("chat_template_kwargs.a")


def test_every_api_decodes_through_the_same_path():
    assert parse(MessagesRequest, {"model": "m", "max_tokens": 4.0, "messages": ASK}).max_tokens == 4
    assert "max_tokens: field required" in error(MessagesRequest, {"model": "m", "messages": ASK}).message
    assert parse(OllamaChatRequest, {"model": "m", "messages": ASK}).stream is True
    assert "colour: unknown field" in error(OllamaChatRequest, {"model": "m", "colour": 1}).message
    assert (
        "top_logprobs: must be between 0 and 20" in error(OllamaChatRequest, {"model": "m", "top_logprobs": 21}).message
    )


def test_records_are_frozen():
    req = parse(ChatCompletionRequest, {"messages": ASK})
    with pytest.raises(AttributeError):
        req.n = 3  # type: ignore[misc]
    assert msgspec.structs.replace(req, n=3).n == 3
