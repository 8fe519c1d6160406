"""hermes (Qwen3 JSON) tool calls: streaming, chunking, variants and malformed output."""

from __future__ import annotations

import json

import pytest
from streamparse_helpers import assert_chunking_invariant, assert_linear_time, collect, parse

from metrale_core.streamparse import make_stream_parser

ARGS = {
    "city": 'Zürich "old town"\n',
    "days": [1, 2.5, -3e2],
    "opts": {"deep": {"x": None}},
    "flag": False,
    "emoji": "🙂",
    "tag": "</tool_call> inside a string",
}
TEXT = (
    "I'll check both.\n\n<tool_call>\n"
    + json.dumps({"name": "get_weather", "arguments": ARGS}, ensure_ascii=False)
    + "\n</tool_call>\n<tool_call>\n"
    + json.dumps({"name": "get_time", "arguments": {}})
    + "\n</tool_call>"
)


def test_parallel_calls_stream_with_indices_and_valid_arguments():
    got = assert_chunking_invariant(TEXT, tool_parser="hermes")
    assert got.content == "I'll check both."
    assert got.calls == {0: ("get_weather", json.dumps(ARGS, ensure_ascii=False)), 1: ("get_time", "{}")}
    assert json.loads(got.calls[0][1]) == ARGS
    assert got.tool_calls == [got.calls[0], got.calls[1]]


def test_arguments_stream_incrementally():
    parser = make_stream_parser(tool_parser="hermes")
    head = parser.feed('<tool_call>\n{"name": "f", "arguments": {"a": "hel')
    assert [(d.tool_call_index, d.name, d.arguments) for d in head] == [(0, "f", '{"a": "hel')]
    more = parser.feed('lo", "b": 1')
    assert [(d.tool_call_index, d.name, d.arguments) for d in more] == [(0, None, 'lo", "b": 1')]
    rest = parser.feed("}}\n</tool_call>") + parser.finish()
    assert "".join(d.arguments for d in rest) == "}"
    assert parser.tool_calls[0]["arguments"] == '{"a": "hello", "b": 1}'


def test_the_id_is_on_the_first_piece_only_and_stable():
    parser = make_stream_parser(tool_parser="hermes", id_factory=iter(["call_" + "a" * 16]).__next__)
    out = parser.feed('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>') + parser.finish()
    assert [d.tool_call_id for d in out] == ["call_" + "a" * 16]
    assert parser.tool_calls == [{"id": "call_" + "a" * 16, "name": "f", "arguments": '{"x": 1}'}]


@pytest.mark.parametrize(
    "body, name, args",
    [
        ('{"name": "noop", "arguments": {}}', "noop", {}),
        ('{"name": "noop"}', "noop", {}),  # no arguments key: none were given
        ('{"arguments": {"a": [1]}, "name": "late"}', "late", {"a": [1]}),
        ('{"name": "p", "parameters": {"a": 1}}', "p", {"a": 1}),
        ('{"name": "s", "arguments": "{\\"a\\": 2}"}', "s", {"a": 2}),
        ('  {"name":"tight","arguments":{"a":1}}  ', "tight", {"a": 1}),
    ],
)
def test_accepted_variants(body, name, args):
    got = assert_chunking_invariant(f"<tool_call>{body}</tool_call>", trials=40, tool_parser="hermes")
    assert got.content == ""
    assert got.calls[0][0] == name and json.loads(got.calls[0][1]) == args
    assert got.tool_calls == [got.calls[0]]


def test_missing_close_tag_at_end_or_before_the_next_call_is_accepted():
    text = '<tool_call>{"name": "a", "arguments": {}}\n<tool_call>{"name": "b", "arguments": {"x": 1}}'
    got = assert_chunking_invariant(text, trials=40, tool_parser="hermes")
    assert got.tool_calls == [("a", "{}"), ("b", '{"x": 1}')] and got.content == ""


def test_plain_content_is_untouched():
    text = "No tools needed: 2 < 3 and <tool is not a tag.  \n"
    got = assert_chunking_invariant(text, tool_parser="hermes")
    assert got.content == text and got.calls == {}


MALFORMED = [
    '<tool_call>\n{"name": "f", "arguments": {"a": 1',  # unterminated JSON
    '<tool_call>\n{"name": "f", "arguments": {"a": 1}\n</tool_call>',  # a brace short
    '<tool_call>\n{"name": "f", "arguments": {"a": tru}}\n</tool_call>',  # invalid literal
    '<tool_call>\n{"name": "f", "args": {"a": 1}}\n</tool_call>',  # unknown key
    '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>',  # not an object
    '<tool_call>\n{"name": 3, "arguments": {}}\n</tool_call>',  # name not a string
    '<tool_call>\n{"arguments": {"a": 1}}\n</tool_call>',  # no name
    '<tool_call>\n{"name": "f", "arguments": {}} trailing\n</tool_call>',  # garbage after
    '<tool_call>get_weather(city="Paris")</tool_call>',  # not JSON at all
    '<tool_call>\n{"name": "f", "arguments": "not json"}\n</tool_call>',  # string, no object
    '<tool_call>\n{"name": "f", "arguments": {"a": "x\ny"}}\n</tool_call>',  # raw control char
    "<tool_call>",  # tag only
]


@pytest.mark.parametrize("call", MALFORMED)
def test_malformed_calls_come_back_as_content(call):
    text = "Before. " + call + " After."
    got = assert_chunking_invariant(text, trials=40, tool_parser="hermes")
    assert got.tool_calls == []  # never a call with made-up arguments
    assert call in got.content  # the model's text, tags included
    assert (got.content.startswith("Before.") and got.content.endswith(" After.")) or got.content.endswith(call)
    for _name, args in got.calls.values():  # a header streamed before it broke
        assert args != "{}" or '"arguments": {}' in call


def test_a_broken_call_does_not_swallow_the_next_one():
    text = (
        '<tool_call>{"name": "a", "arguments": {"x": oops}}</tool_call>\n'
        '<tool_call>{"name": "b", "arguments": {"y": 2}}</tool_call>'
    )
    got = assert_chunking_invariant(text, trials=40, tool_parser="hermes")
    assert got.tool_calls == [("b", '{"y": 2}')]
    assert got.content == '<tool_call>{"name": "a", "arguments": {"x": oops}}</tool_call>'
    assert got.calls[1] == ("b", '{"y": 2}')  # index 0 was used by the broken call's header


def test_unterminated_new_call_inside_broken_one():
    text = '<tool_call>{"name": "a", "arg<tool_call>{"name": "b", "arguments": {}}</tool_call>'
    got, _ = parse([text], tool_parser="hermes")
    # the first call's JSON string swallows "<tool_call>"; the string never closes properly
    assert got.tool_calls == [] and text in got.content


def _feed_long_arguments(size: int) -> None:
    value = "x" * size
    text = (
        '<tool_call>{"name": "w", "arguments": {"text": "' + value + '", "n": 0.' + "5" * (size // 4) + "}}</tool_call>"
    )
    parser = make_stream_parser(tool_parser="hermes")
    deltas = []
    for i in range(0, len(text), 3):
        deltas += parser.feed(text[i : i + 3])
    deltas += parser.finish()
    got = collect(deltas, parser)
    assert json.loads(got.calls[0][1])["text"] == value


def test_linear_time_on_long_arguments():
    assert_linear_time(_feed_long_arguments, 50_000)
