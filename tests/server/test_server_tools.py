"""Tool calls and reasoning through the server: the scripted model emits a hermes call
(``<tool_call>{json}</tool_call>``) and ``<think>`` blocks; the official client reads them."""

from __future__ import annotations

import json

import openai
import pytest
from server_testlib import ASK, TOOLS


def test_tool_call_non_streaming(client):
    resp = client.chat.completions.create(model="scripted", messages=ASK, tools=TOOLS, temperature=0)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert call.id


def test_tool_call_streaming_fragments_concatenate_to_the_same_call(client):
    stream = client.chat.completions.create(model="scripted", messages=ASK, tools=TOOLS, temperature=0, stream=True)
    names, args, ids, finish, content = [], [], set(), None, ""
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            assert tc.index == 0
            if tc.id:
                ids.add(tc.id)
            if tc.function and tc.function.name:
                names.append(tc.function.name)
            if tc.function and tc.function.arguments:
                args.append(tc.function.arguments)
        finish = chunk.choices[0].finish_reason or finish
    assert names == ["get_weather"] and len(ids) == 1
    assert json.loads("".join(args)) == {"city": "Paris"}
    assert finish == "tool_calls"
    assert "<tool_call>" not in content


def test_tool_result_round_trip(client):
    first = client.chat.completions.create(model="scripted", messages=ASK, tools=TOOLS, temperature=0)
    call = first.choices[0].message.tool_calls[0]
    messages = ASK + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny"}'},
    ]
    resp = client.chat.completions.create(model="scripted", messages=messages, tools=TOOLS, temperature=0)
    assert resp.choices[0].message.content == "It is sunny in Paris."
    assert resp.choices[0].finish_reason == "stop"


def test_tool_choice_none_leaves_the_text_alone(client):
    resp = client.chat.completions.create(
        model="scripted", messages=ASK, tools=TOOLS, tool_choice="none", temperature=0
    )
    msg = resp.choices[0].message
    assert not msg.tool_calls and resp.choices[0].finish_reason == "stop"
    assert '"name": "get_weather"' in msg.content


def test_named_and_required_tool_choice(client):
    named = {"type": "function", "function": {"name": "get_weather"}}
    resp = client.chat.completions.create(model="scripted", messages=ASK, tools=TOOLS, tool_choice=named, temperature=0)
    assert resp.choices[0].message.tool_calls[0].function.name == "get_weather"
    resp = client.chat.completions.create(
        model="scripted", messages=ASK, tools=TOOLS, tool_choice="required", temperature=0
    )
    assert resp.choices[0].finish_reason == "tool_calls"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="scripted", messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}
        )
    assert "tool_choice.function.name" in info.value.body["message"]


def test_reasoning_is_split_into_reasoning_content(client, base_url):
    ask = [{"role": "user", "content": "ponder 2+2"}]
    resp = client.chat.completions.create(model="scripted", messages=ask, temperature=0)
    msg = resp.choices[0].message
    assert msg.content.strip() == "The answer is 4."
    assert msg.model_extra["reasoning_content"].strip() == "Two and two make four."
    stream = client.chat.completions.create(model="scripted", messages=ask, temperature=0, stream=True)
    reasoning = content = ""
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
    assert content.strip() == "The answer is 4." and reasoning.strip() == "Two and two make four."
