"""``/v1/responses`` with the official ``openai`` client on a real uvicorn server (the scripted
model): plain text, a tool round trip with ``function_call_output``, ``previous_response_id``,
``responses.stream()`` collecting the final response, reasoning items, the raw event order,
``GET``/``DELETE`` and the bounded store, and the OpenAI error shape for bad input."""

from __future__ import annotations

import httpx
import openai
import pytest
from api_events import check_responses_stream, parse_sse
from server_testlib import answer_function_call

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def test_create_text(client):
    r = client.responses.create(model="scripted", input="What is the capital of France?")
    assert r.status == "completed" and r.object == "response"
    assert r.output_text == "The capital of France is Paris."
    assert [i.type for i in r.output] == ["message"]
    assert r.usage.input_tokens > 0
    assert r.usage.output_tokens == len("The capital of France is Paris.") + 1
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_instructions_and_message_items(client):
    r = client.responses.create(
        model="scripted",
        instructions="Be brief.",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "What is the capital?"}]}],
    )
    assert r.output_text == "The capital of France is Paris."


def test_max_output_tokens_is_incomplete(client):
    r = client.responses.create(model="scripted", input="count", max_output_tokens=5)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text == "one t"


def test_tool_round_trip_with_function_call_output(client):
    first = client.responses.create(model="scripted", tools=[WEATHER_TOOL], input="What is the weather in Paris?")
    (call,) = [i for i in first.output if i.type == "function_call"]
    assert call.name == "get_weather" and call.arguments.replace(" ", "") == '{"city":"Paris"}'
    assert call.call_id and first.output_text == ""
    follow = client.responses.create(
        model="scripted",
        tools=[WEATHER_TOOL],
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 24C"},
        ],
    )
    assert follow.output_text == "It is sunny in Paris."


def test_previous_response_id_continues_the_conversation(client):
    first = client.responses.create(model="scripted", tools=[WEATHER_TOOL], input="What is the weather in Paris?")
    _, follow = answer_function_call(client, "scripted", WEATHER_TOOL, first, "sunny")
    assert follow.output_text == "It is sunny in Paris."
    assert follow.previous_response_id == first.id
    # the prompt grew by the stored conversation
    assert follow.usage.input_tokens > first.usage.input_tokens
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model="scripted", previous_response_id="resp_missing", input="x")
    assert "previous_response_id" in str(info.value)


def test_stream_helper_collects_the_final_response(client):
    with client.responses.stream(model="scripted", input="What is the capital of France?") as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert "".join(deltas) == final.output_text == "The capital of France is Paris."
    assert final.status == "completed" and final.usage.output_tokens > 0


def test_stream_helper_with_tools(client):
    with client.responses.stream(model="scripted", input="What is the weather in Paris?", tools=[WEATHER_TOOL]) as s:
        events = list(s)
        arg_deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
        text_deltas = [e for e in events if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    (call,) = [i for i in final.output if i.type == "function_call"]
    assert len(arg_deltas) > 1 and "".join(arg_deltas) == call.arguments
    assert not text_deltas  # arguments never travel as text


@pytest.mark.parametrize(
    "prompt,kinds",
    [
        ("What is the capital of France?", ["message"]),
        ("What is the weather in Paris?", ["function_call"]),
        ("Please ponder 2+2.", ["reasoning", "message"]),
    ],
)
def test_raw_event_order(base_url, prompt, kinds):
    raw = httpx.post(
        base_url + "/v1/responses",
        json={"model": "scripted", "input": prompt, "stream": True, "tools": [WEATHER_TOOL]},
        timeout=60,
    )
    assert raw.status_code == 200
    events = parse_sse(raw.text)
    assert all(name == data["type"] for name, data in events)
    final = check_responses_stream(events)
    assert [i["type"] for i in final["output"]] == kinds
    assert final["status"] == "completed"


def test_reasoning_items(client):
    r = client.responses.create(model="scripted", input="Please ponder 2+2.", reasoning={"effort": "low"})
    assert [i.type for i in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text.strip() == "Two and two make four."
    assert r.output_text.strip() == "The answer is 4."


def test_get_and_delete(client, base_url):
    r = client.responses.create(model="scripted", input="capital")
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    assert httpx.delete(base_url + f"/v1/responses/{r.id}").status_code == 404
    unstored = client.responses.create(model="scripted", input="capital", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_store_is_a_bounded_lru(start_server):
    server, _ = start_server(responses_store_size=2)
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    a, b = (c.responses.create(model="scripted", input="capital") for _ in range(2))
    c.responses.retrieve(a.id)  # a is now the most recently used
    c.responses.create(model="scripted", input="capital")  # evicts b
    assert c.responses.retrieve(a.id).id == a.id
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(b.id)


def test_response_store_unit():
    from metrale_core.server.responses.store import ResponseStore, StoredResponse

    store = ResponseStore(2)
    for key in "abc":
        store.put(key, StoredResponse(body={"id": key}, messages=()))
    assert len(store) == 2 and store.get("a") is None and store.get("b") is not None
    store.put("d", StoredResponse(body={}, messages=()))
    assert store.get("c") is None and store.get("b") is not None
    assert ResponseStore(0).put("x", StoredResponse(body={}, messages=())) is None
    assert len(ResponseStore(0)) == 0


GOOD = {"model": "scripted", "input": "hi"}

BAD = [
    ({"input": None}, "input"),
    ({"input": 5}, "input"),
    ({"input": []}, "input"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0].type"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "function"}]}, "tools[0].name"),
    ({"tools": [{"type": "function", "name": "f", "function": {}}]}, "tools[0].function"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "file_search"}}, "tool_choice.type"),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
    (
        {
            "text": {
                "format": {
                    "type": "json_schema",
                    "name": "x",
                    "schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}},
                }
            }
        },
        "text.format",
    ),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"reasoning": {"effort": "huge"}}, "reasoning.effort"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"background": True}, "background"),
    ({"stream": "yes"}, "stream"),
    ({"bogus": 1}, "bogus"),
    ({"model": "other"}, "model"),
]


@pytest.mark.parametrize("change,field", BAD, ids=[f for _, f in BAD])
def test_bad_input_is_a_4xx_in_openai_shape(base_url, change, field):
    body = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    r = httpx.post(base_url + "/v1/responses", json=body, timeout=30)
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert field in error["message"], error


def test_unknown_response_id_is_404(base_url):
    r = httpx.get(base_url + "/v1/responses/resp_nope")
    assert r.status_code == 404 and r.json()["error"]["param"] == "response_id"
