"""JSON tool calls after a marker: Granite's ``<|tool_call|>[...]`` and Phi-4-mini's
``<|tool_call|>...<|/tool_call|>`` (one object or a list); malformed ones come back as content."""

from __future__ import annotations

import json

import pytest
from streamparse_helpers import assert_chunking_invariant

from metrale_core.streamparse import make_stream_parser
from metrale_core.streamparse.jsoncalls import GraniteParser, Phi4MiniParser, decode_calls

TWO = '[{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}, {"name": "now", "arguments": {}}]'


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        ("granite", "<|tool_call|>" + TWO),
        ("granite", "<|tool_call|> " + TWO + "\n"),
        ("phi4_mini", "<|tool_call|>" + TWO + "<|/tool_call|>"),
        ("phi4_mini", "<|tool_call|>" + TWO),  # the closing tag may be missing at the end
    ],
)
def test_a_list_of_calls(fmt, text):
    got = assert_chunking_invariant(text, tool_parser=fmt, tools=[])
    assert got.content == ""
    assert [(n, json.loads(a)) for n, a in got.tool_calls] == [
        ("get_weather", {"city": "Paris", "days": [1, 2]}),
        ("now", {}),
    ]
    assert got.calls == dict(enumerate(got.tool_calls))


def test_phi4_single_object_openai_nesting_and_text_around():
    text = (
        "Let me look.<|tool_call|>"
        '{"type": "function", "function": {"name": "f", "parameters": {"a": 1}}}'
        '<|/tool_call|> Then more.<|tool_call|>[{"name": "g"}]<|/tool_call|>'
    )
    got = assert_chunking_invariant(text, tool_parser="phi4_mini", tools=[])
    assert got.content == "Let me look. Then more."
    assert got.tool_calls == [("f", '{"a": 1}'), ("g", "{}")]


@pytest.mark.parametrize(
    "text",
    [
        'Sure.<|tool_call|>[{"name": "f", "arguments": {"a": nope}}]<|/tool_call|>',
        'Sure.<|tool_call|>[{"name": "bad name", "arguments": {}}]<|/tool_call|>',
        'Sure.<|tool_call|>[{"name": "f", "arguments": "not json"}]<|/tool_call|>',
        'Sure.<|tool_call|>[{"name": "f", "arguments": {}}',  # the stream ends inside
        "Sure.<|tool_call|>get_weather(city='Paris')<|/tool_call|>",  # not JSON at all
        'Sure.<|tool_call|>["f"]<|/tool_call|>',
    ],
)
def test_malformed_calls_come_back_as_content(text):
    got = assert_chunking_invariant(text, tool_parser="phi4_mini", tools=[])
    assert got.tool_calls == [] and got.calls == {}
    assert got.content == text


def test_a_bad_call_then_a_good_one_with_granite():
    text = '<|tool_call|>[{"name": 1}] and <|tool_call|>[{"name": "g", "arguments": {"b": 2}}]'
    got = assert_chunking_invariant(text, tool_parser="granite", tools=[])
    assert got.content == '<|tool_call|>[{"name": 1}] and'
    assert got.tool_calls == [("g", '{"b": 2}')]


def test_picked_by_template_and_model_type():
    granite = "respond only with <|tool_call|> followed by a JSON list of tools used."
    phi4 = "{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + message['tools'] + '<|/tool|>' }}"
    assert isinstance(make_stream_parser(tools=[], chat_template=granite).tool_parser, GraniteParser)
    assert isinstance(make_stream_parser(tools=[], chat_template=phi4).tool_parser, Phi4MiniParser)
    assert isinstance(make_stream_parser(tools=[], model_type="granite").tool_parser, GraniteParser)
    assert isinstance(make_stream_parser(tools=[], model_type="phi3").tool_parser, Phi4MiniParser)
    assert make_stream_parser(tools=[], model_type="granite").keeps_special_tokens
    assert not make_stream_parser(tools=[], model_type="qwen3").keeps_special_tokens  # hermes tags are text


def test_decode_calls_rules():
    assert decode_calls({"name": "f", "arguments": {"x": "é"}}) == [("f", '{"x": "é"}')]
    assert decode_calls({"name": "f", "id": "abc", "type": "function"}) == [("f", "{}")]
    assert isinstance(decode_calls([]), str)
    assert isinstance(decode_calls({"name": "f", "arguments": 3}), str)
