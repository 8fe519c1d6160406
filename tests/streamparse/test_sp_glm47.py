"""glm47 (GLM-4.7 / GLM-5.x arg_key/arg_value) tool calls, plus GLM-4.5's newline layout."""

from __future__ import annotations

import json

import pytest
from streamparse_helpers import assert_chunking_invariant

from metrale_core.streamparse import make_stream_parser

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "integer"},
                    "filters": {"type": "object"},
                    "exact": {"type": "boolean"},
                }
            },
        },
    }
]


def glm(name, params):
    return (
        "<tool_call>"
        + name
        + "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in params)
        + "</tool_call>"
    )


def test_compact_calls_in_parallel_with_types():
    text = (
        "Let me look.\n"
        + glm(
            "search",
            [("query", " spaced  <b>bold</b> "), ("limit", "10"), ("filters", '{"lang": "en"}'), ("exact", "false")],
        )
        + glm("now", [])
        + glm("search", [("query", "null")])
    )
    got = assert_chunking_invariant(text, tool_parser="glm47", tools=TOOLS)
    assert got.content == "Let me look."
    assert [c[0] for c in got.calls.values()] == ["search", "now", "search"]
    assert json.loads(got.calls[0][1]) == {
        "query": " spaced  <b>bold</b> ",
        "limit": 10,
        "filters": {"lang": "en"},
        "exact": False,
    }
    assert got.calls[1][1] == "{}" and json.loads(got.calls[2][1]) == {"query": None}
    assert got.tool_calls == list(got.calls.values())


def test_glm45_newline_layout():
    text = (
        "\n<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>two\nlines</arg_value>\n"
        "<arg_key>limit</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"
    )
    got = assert_chunking_invariant(text, tool_parser="glm47", tools=TOOLS)
    assert got.content == "" and json.loads(got.calls[0][1]) == {"query": "two\nlines", "limit": 3}


def test_string_values_stream():
    parser = make_stream_parser(tool_parser="glm47", tools=TOOLS)
    out = parser.feed("<tool_call>search<arg_key>query</arg_key><arg_value>cats and")
    assert [(d.name, d.arguments) for d in out] == [("search", '{"query": "cats and')]
    out = parser.feed(" dogs</arg_value></tool_call>") + parser.finish()
    assert "".join(d.arguments for d in out) == ' dogs"}'


def test_missing_close_tag_at_end_of_stream_is_accepted():
    text = "<tool_call>search<arg_key>limit</arg_key><arg_value>5</arg_value>"
    got = assert_chunking_invariant(text, trials=40, tool_parser="glm47", tools=TOOLS)
    assert got.tool_calls == [("search", '{"limit": 5}')]


MALFORMED = [
    "<tool_call>search<arg_key>query</arg_key><arg_value>never closed",
    "<tool_call>search<arg_key>query<arg_value>x</arg_value></tool_call>",  # no </arg_key>
    "<tool_call>search<arg_key>query</arg_key>oops<arg_value>x</arg_value></tool_call>",
    '<tool_call>{"name": "search", "arguments": {}}</tool_call>',  # hermes JSON
    "<tool_call>search now<arg_key>q</arg_key><arg_value>x</arg_value></tool_call>",
    "<tool_call>search<arg_key></arg_key><arg_value>x</arg_value></tool_call>",  # empty key
    "<tool_call>search",
]


@pytest.mark.parametrize("bad", MALFORMED)
def test_malformed_calls_come_back_as_content(bad):
    text = "Hmm. " + bad + " ok"
    got = assert_chunking_invariant(text, trials=40, tool_parser="glm47", tools=TOOLS)
    assert got.tool_calls == [] and got.content == text
    for _, args in got.calls.values():
        assert "{}" not in args
