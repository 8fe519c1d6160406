"""qwen3_coder (XML functions/parameters) tool calls: types, streaming, chunking, malformed output."""

from __future__ import annotations

import json

import pytest
from streamparse_helpers import assert_chunking_invariant, assert_linear_time

from metrale_core.streamparse import make_stream_parser

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "parameters": {
                "type": "object",
                "properties": {
                    "code": {"type": "string"},
                    "n": {"type": "integer"},
                    "ratio": {"type": "number"},
                    "on": {"type": "boolean"},
                    "cfg": {"type": "object"},
                    "items": {"type": "array"},
                    "maybe": {"type": ["integer", "null"]},
                    "mode": {"enum": ["a", "b"]},
                },
            },
        },
    }
]


def call(name, params, nl=True):
    sep = "\n" if nl else ""
    body = "".join(f"<parameter={k}>{sep}{v}{sep}</parameter>{sep}" for k, v in params)
    return f"<tool_call>{sep}<function={name}>{sep}{body}</function>{sep}</tool_call>"


def test_values_are_converted_by_schema_type():
    text = "Running it.\n" + call(
        "run",
        [
            ("code", 'print("hi")\nx = {"a": 1}  # 2 < 3'),
            ("n", "42"),
            ("ratio", "0.5"),
            ("on", "True"),
            ("cfg", '{"k": [1, 2]}'),
            ("items", "['a', 'b']"),
            ("maybe", "null"),
            ("mode", "a"),
            ("extra", "7"),
            ("code2", "null"),
        ],
    )
    got = assert_chunking_invariant(text, tool_parser="qwen3_coder", tools=TOOLS)
    assert got.content == "Running it."
    ((name, args),) = got.calls.values()
    assert name == "run" and got.tool_calls == [(name, args)]
    assert json.loads(args) == {
        "code": 'print("hi")\nx = {"a": 1}  # 2 < 3',
        "n": 42,
        "ratio": 0.5,
        "on": True,
        "cfg": {"k": [1, 2]},
        "items": ["a", "b"],
        "maybe": None,
        "mode": "a",
        "extra": "7",
        "code2": None,
    }


def test_values_that_do_not_convert_are_kept_as_strings():
    text = call("run", [("n", "forty-two"), ("on", "yes"), ("cfg", "{broken"), ("ratio", "1/2")])
    got = assert_chunking_invariant(text, trials=50, tool_parser="qwen3_coder", tools=TOOLS)
    assert json.loads(got.calls[0][1]) == {"n": "forty-two", "on": "yes", "cfg": "{broken", "ratio": "1/2"}


def test_string_values_stream_before_the_body_closes():
    parser = make_stream_parser(tool_parser="qwen3_coder", tools=TOOLS)
    out = parser.feed("<tool_call>\n<function=run>\n<parameter=code>\nimport os\n")
    assert [(d.name, d.arguments) for d in out] == [("run", '{"code": "import os')]
    out = parser.feed("os.x\n</parameter>\n<parameter=n>\n4")
    assert "".join(d.arguments for d in out) == '\\nos.x", "n": '  # the integer waits for its end
    out = parser.feed("2\n</parameter>\n</function>\n</tool_call>") + parser.finish()
    assert "".join(d.arguments for d in out) == "42}"


def test_only_one_leading_and_one_trailing_newline_are_stripped():
    text = call("run", [("code", "\n  indented\n\n")])
    got = assert_chunking_invariant(text, trials=50, tool_parser="qwen3_coder", tools=TOOLS)
    assert json.loads(got.calls[0][1]) == {"code": "\n  indented\n\n"}


def test_zero_argument_and_parallel_calls():
    text = call("noop", []) + "\n" + call("run", [("n", "1")], nl=False) + "\n" + call("noop", [])
    got = assert_chunking_invariant(text, tool_parser="qwen3_coder", tools=TOOLS)
    assert got.content == ""
    assert got.calls == {0: ("noop", "{}"), 1: ("run", '{"n": 1}'), 2: ("noop", "{}")}


def test_missing_closing_tags_that_vllm_tolerates():
    text = (
        "<tool_call>\n<function=run>\n<parameter=n>\n1\n<parameter=code>\nx\n</function>\n</tool_call>"
        "<tool_call>\n<function=run>\n<parameter=n>\n2\n</parameter>\n</tool_call>"
        "<tool_call>\n<function=run>\n<parameter=n>\n3\n</parameter>\n</function>"
    )
    got = assert_chunking_invariant(text, tool_parser="qwen3_coder", tools=TOOLS)
    assert [json.loads(a) for _, a in got.tool_calls] == [{"n": 1, "code": "x"}, {"n": 2}, {"n": 3}]


MALFORMED = [
    "<tool_call>\n<function=run>\n<parameter=code>\nunterminated",  # stream ends in a value
    "<tool_call>\n<function=run>\n<parameter=code>\nx\n</parameter>\n",  # ends before </function>
    "<tool_call>\n<function=run name>\n</function>\n</tool_call>",  # bad function name
    "<tool_call>\n<function=run>\n<parameter=a b>\n1\n</parameter>\n</function>\n</tool_call>",
    "<tool_call>\nrun(n=1)\n</tool_call>",  # no <function=
    "<tool_call>\n<function=run>\ngarbage<parameter=n>1</parameter></function></tool_call>",
    "<tool_call>\n<function=run",  # cut in the name
]


@pytest.mark.parametrize("bad", MALFORMED)
def test_malformed_calls_come_back_as_content(bad):
    text = "Before " + bad
    got = assert_chunking_invariant(text, trials=40, tool_parser="qwen3_coder", tools=TOOLS)
    assert got.tool_calls == []
    assert got.content == text
    for _, args in got.calls.values():  # a streamed header never ends in invented arguments
        assert "{}" not in args


def test_broken_call_then_good_call():
    text = "<tool_call>\n<function=?>\n</tool_call>" + call("run", [("n", "5")])
    got = assert_chunking_invariant(text, trials=40, tool_parser="qwen3_coder", tools=TOOLS)
    assert got.content == "<tool_call>\n<function=?>\n</tool_call>"
    assert got.tool_calls == [("run", '{"n": 5}')]


def _feed_long_values(lines: int) -> None:
    value = ("line <b> x\n" * lines)[:-1]
    text = call("run", [("code", value), ("n", "7" * (lines // 7))])
    parser = make_stream_parser(tool_parser="qwen3_coder", tools=TOOLS)
    deltas = [d for ch in text for d in parser.feed(ch)] + parser.finish()
    assert "".join(d.arguments for d in deltas) == parser.tool_calls[0]["arguments"]
    assert json.loads(parser.tool_calls[0]["arguments"])["code"] == value


def test_linear_time_on_long_values():
    assert_linear_time(_feed_long_values, 5_000)
