"""``/v1/messages`` and ``/v1/messages/count_tokens`` with the official ``anthropic`` client on a
real uvicorn server (the scripted model: text, tool calls, thinking, stop sequences), the raw
event sequence, auth by ``x-api-key`` and Bearer, and the Anthropic error shape for bad input."""

from __future__ import annotations

import anthropic
import httpx
import pytest
from api_events import check_messages_stream, parse_sse
from server_testlib import API_KEY, answer_tool_use, messages_sse

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Weather of a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def aclient(base_url):
    return anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0, timeout=60)


def _ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_create_text(aclient):
    msg = aclient.messages.create(model="scripted", max_tokens=64, messages=_ask("What is the capital of France?"))
    assert msg.type == "message" and msg.role == "assistant"
    assert [b.type for b in msg.content] == ["text"]
    assert msg.content[0].text == "The capital of France is Paris."
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None
    assert msg.usage.input_tokens > 0
    assert msg.usage.output_tokens == len("The capital of France is Paris.") + 1  # bytes + EOS


def test_system_blocks_and_count_tokens_agree_with_usage(aclient):
    kwargs = dict(
        model="scripted",
        system=[{"type": "text", "text": "Be brief."}],
        messages=_ask("What is the capital of France?"),
        tools=[WEATHER_TOOL],
    )
    counted = aclient.messages.count_tokens(**kwargs)
    msg = aclient.messages.create(max_tokens=64, **kwargs)
    assert counted.input_tokens == msg.usage.input_tokens > 0


def test_stream_text_and_event_order(aclient, base_url):
    with aclient.messages.stream(
        model="scripted", max_tokens=64, messages=_ask("What is the capital of France?")
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == "The capital of France is Paris."
    assert final.stop_reason == "end_turn" and final.usage.input_tokens > 0
    events = parse_sse(messages_sse(base_url, _ask("What is the capital of France?"), 64))
    assert [n for n, _ in events][:2] == ["message_start", "ping"]
    blocks = check_messages_stream(events)
    assert blocks == [{"type": "text", "text": "The capital of France is Paris."}]
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"
    assert events[-2][1]["usage"]["output_tokens"] == final.usage.output_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_tool_round_trip(aclient, stream):
    kwargs = dict(
        model="scripted", max_tokens=128, tools=[WEATHER_TOOL], messages=_ask("What is the weather in Paris?")
    )
    if stream:
        with aclient.messages.stream(**kwargs) as s:
            msg = s.get_final_message()
    else:
        msg = aclient.messages.create(**kwargs)
    assert msg.stop_reason == "tool_use"
    call, follow = answer_tool_use(aclient, "scripted", WEATHER_TOOL, kwargs["messages"], msg, "sunny, 24C")
    assert call.name == "get_weather" and call.input == {"city": "Paris"}
    assert not any(b.type == "text" and "tool_call" in b.text for b in msg.content)
    assert follow.content[0].text == "It is sunny in Paris." and follow.stop_reason == "end_turn"


def test_tool_use_streams_input_json_deltas(base_url):
    events = parse_sse(messages_sse(base_url, _ask("What is the weather in Paris?"), 128, tools=[WEATHER_TOOL]))
    blocks = check_messages_stream(events)
    assert [b["type"] for b in blocks] == ["tool_use"]
    assert blocks[0]["input"] == {"city": "Paris"}
    json_deltas = [d for n, d in events if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta"]
    assert len(json_deltas) > 1  # streamed as fragments
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequence(aclient, stream):
    kwargs = dict(
        model="scripted", max_tokens=128, stop_sequences=["five", "four"], messages=_ask("Please count to ten.")
    )
    if stream:
        with aclient.messages.stream(**kwargs) as s:
            msg = s.get_final_message()
    else:
        msg = aclient.messages.create(**kwargs)
    assert msg.content[0].text == "one two three "
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == "four"


def test_max_tokens_stop_reason(aclient):
    msg = aclient.messages.create(model="scripted", max_tokens=5, messages=_ask("count"))
    assert msg.stop_reason == "max_tokens" and msg.content[0].text == "one t"
    assert msg.usage.output_tokens == 5


@pytest.mark.parametrize("stream", [False, True])
def test_thinking_blocks(aclient, stream):
    kwargs = dict(
        model="scripted",
        max_tokens=128,
        thinking={"type": "enabled", "budget_tokens": 64},
        messages=_ask("Please ponder 2+2."),
    )
    if stream:
        with aclient.messages.stream(**kwargs) as s:
            msg = s.get_final_message()
    else:
        msg = aclient.messages.create(**kwargs)
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking.strip() == "Two and two make four."
    assert msg.content[1].text.strip() == "The answer is 4."


def test_sampling_fields_via_extra_body(aclient):
    msg = aclient.messages.create(
        model="scripted",
        max_tokens=8,
        messages=_ask("hello there"),
        extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 5},
    )
    assert msg.usage.output_tokens == 8 and msg.stop_reason == "max_tokens"


def test_x_api_key_and_bearer_auth(start_server):
    server, _ = start_server(api_key=API_KEY)
    body = {"model": "scripted", "max_tokens": 16, "messages": _ask("capital")}
    ok = httpx.post(server.url + "/v1/messages", json=body, headers={"x-api-key": API_KEY})
    assert ok.status_code == 200
    bearer = anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0)
    assert bearer.messages.create(**body).content[0].text.startswith("The capital")
    bad = httpx.post(server.url + "/v1/messages", json=body, headers={"x-api-key": "wrong"})
    assert bad.status_code == 401
    assert bad.json()["type"] == "error"
    assert bad.json()["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0).messages.create(**body)


GOOD = {"model": "scripted", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}

#: (body changes, the field the message must name)
BAD = [
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": "16"}, "max_tokens"),
    ({"messages": None}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, "messages[0].content[0].tool_use_id"),
    (
        {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "x"}]}]},
        "messages[0].content[0].input",
    ),
    ({"system": 3}, "system"),
    ({"system": [{"type": "image"}]}, "system[0].type"),
    ({"temperature": 1.5}, "temperature"),
    ({"top_k": -1}, "top_k"),
    ({"stop_sequences": "x"}, "stop_sequences"),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "maybe"}}, "tool_choice.type"),
    ({"thinking": {"type": "sometimes"}}, "thinking.type"),
    (
        {
            "output_config": {
                "format": {
                    "type": "json_schema",
                    "schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}},
                }
            }
        },
        "output_config.format",
    ),
    ({"output_config": {"format": {"type": "yaml"}}}, "output_config.format"),
    ({"bogus": 1}, "bogus"),
    ({"model": "other"}, "model"),
]


@pytest.mark.parametrize("change,field", BAD, ids=[f for _, f in BAD])
def test_bad_input_is_a_4xx_in_anthropic_shape(base_url, change, field):
    body = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        if path.endswith("count_tokens"):
            # count_tokens renders the prompt only: sampling fields and a schema's grammar
            # (compiled when the request is planned) are not its business.
            if field in ("max_tokens", "temperature", "top_k", "stop_sequences") or "nonsense" in str(change):
                continue
            body = {k: v for k, v in body.items() if k != "max_tokens"}
        r = httpx.post(base_url + path, json=body, timeout=30)
        assert 400 <= r.status_code < 500, (path, r.status_code, r.text)
        data = r.json()
        assert data["type"] == "error" and set(data["error"]) == {"type", "message"}, data
        assert field in data["error"]["message"], (path, data)


def test_malformed_json_and_client_error_class(base_url, aclient):
    r = httpx.post(base_url + "/v1/messages", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError) as info:
        aclient.messages.create(model="scripted", max_tokens=16, messages=[{"role": "robot", "content": "x"}])
    assert "messages[0].role" in str(info.value)
