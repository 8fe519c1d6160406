"""B1 state (inside_tool_call, inside_parameter_body, param_body_chars_emitted) at every position.

Each script is marked up (see ``streamparse_helpers.expected_states``); the parser is fed the
script one character at a time and, separately, in random chunks, and after every feed its state
must equal the marked state of the prefix it has seen.
"""

from __future__ import annotations

import json
import random

import pytest
from streamparse_helpers import expected_states, parser_state, random_pieces

from metrale_core.streamparse import make_stream_parser

HERMES = (
    'Sure.\n<tool_call>⦃\n{"name": "get_weather", "arguments": {"city": "⟦Pa\\"ris"†, '
    '"days": ⊕12,† "opts": {⟦"unit": "c", "n": [1, 2]}†, "ok": ⊕true†, "x": ⊕-0.5e3}†}\n'
    '</tool_call>⦄\n<tool_call>⦃\n{"name": "noop", "arguments": {}}\n</tool_call>⦄ done'
)
HERMES_STRING_ARGS = '<tool_call>⦃{"name": "f", "arguments": "⟦{\\"a\\": 1}"†}</tool_call>⦄'
QWEN3_CODER = (
    "Let me check.\n<tool_call>⦃\n<function=get_weather>\n<parameter=city>⟦·\nNew York⟧\n"
    "</parameter>†\n<parameter=n>⟦·\n42⟧\n<parameter=†m>⟦x⟧</function>†\n</tool_call>⦄\n"
    "<tool_call>⦃\n<function=noop>\n</function>\n</tool_call>⦄"
)
GLM47 = (
    "<tool_call>⦃get_weather<arg_key>city</arg_key><arg_value>⟦Paris⟧</arg_value>†"
    "<arg_key>days</arg_key><arg_value>⟦5⟧</arg_value>†</tool_call>⦄"
    "<tool_call>⦃noop</tool_call>⦄"
)
GLM45 = "<tool_call>⦃get_weather\n<arg_key>city</arg_key>\n<arg_value>⟦Par\nis⟧</arg_value>†\n</tool_call>⦄"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "n": {"type": "integer"}, "days": {"type": "integer"}},
            },
        },
    }
]

CASES = [
    ("hermes", HERMES, {"city": 'Pa"ris', "days": 12, "opts": {"unit": "c", "n": [1, 2]}, "ok": True, "x": -500.0}),
    ("hermes", HERMES_STRING_ARGS, {"a": 1}),
    ("qwen3_coder", QWEN3_CODER, {"city": "New York", "n": 42, "m": "x"}),
    ("glm47", GLM47, {"city": "Paris", "days": 5}),
    ("glm47", GLM45, {"city": "Par\nis"}),
]


def _case_id(value):
    return value if isinstance(value, str) and len(value) < 20 else None


@pytest.mark.parametrize("fmt, marked, first_args", CASES, ids=_case_id)
def test_state_at_every_character(fmt, marked, first_args):
    text, states = expected_states(marked)
    parser = make_stream_parser(tool_parser=fmt, tools=TOOLS)
    assert parser_state(parser) == states[0]
    for k, ch in enumerate(text, start=1):
        parser.feed(ch)
        assert parser_state(parser) == states[k], f"after {text[:k]!r}"
    parser.finish()
    assert json.loads(parser.tool_calls[0]["arguments"]) == first_args


@pytest.mark.parametrize("fmt, marked, first_args", CASES, ids=_case_id)
def test_state_at_random_chunk_boundaries(fmt, marked, first_args):
    text, states = expected_states(marked)
    rng = random.Random(7)
    for _ in range(60):
        parser = make_stream_parser(tool_parser=fmt, tools=TOOLS)
        seen = 0
        for piece in random_pieces(text, rng):
            parser.feed(piece)
            seen += len(piece)
            assert parser_state(parser) == states[seen], f"after {text[:seen]!r}"


def test_tag_straddling_chunks_keeps_committed_state():
    parser = make_stream_parser(tool_parser="qwen3_coder")
    parser.feed("<tool_call>\n<function=f>\n<parameter=p>\nab")
    assert parser_state(parser) == (True, True, 2)
    parser.feed("</para")  # held back: could be the closing tag
    assert parser_state(parser) == (True, True, 2)
    parser.feed("meter>")
    assert parser_state(parser) == (True, False, 0)


def test_held_back_characters_count_once_they_prove_to_be_value_text():
    parser = make_stream_parser(tool_parser="qwen3_coder")
    parser.feed("<tool_call>\n<function=f>\n<parameter=p>\na\n")
    assert parser.param_body_chars_emitted == 1  # the "\n" may be the trailing newline
    parser.feed("b<")
    assert parser.param_body_chars_emitted == 3  # "a\nb"; "<" may open a tag
    parser.feed("c")
    assert parser.param_body_chars_emitted == 5
    parser.feed("\n</parameter>\n</function>\n</tool_call>")
    parser.finish()
    assert json.loads(parser.tool_calls[0]["arguments"]) == {"p": "a\nb<c"}


def test_glm_partial_close_tag_inside_value():
    parser = make_stream_parser(tool_parser="glm47")
    parser.feed("<tool_call>f<arg_key>k</arg_key><arg_value>12</arg_")
    assert parser_state(parser) == (True, True, 2)
    parser.feed("x")  # "</arg_x" was value text after all
    assert parser_state(parser) == (True, True, 9)
    parser.feed("</arg_value></tool_call>")
    parser.finish()
    assert parser.tool_calls[0]["arguments"] == '{"k": "12</arg_x"}'


@pytest.mark.parametrize(
    "fmt, call",
    [
        ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": "x"}}\n</tool_call>'),
        ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=a>\nx\n</parameter>\n</function>\n</tool_call>"),
        ("glm47", "<tool_call>f<arg_key>a</arg_key><arg_value>x</arg_value></tool_call>"),
    ],
)
def test_reasoning_is_never_a_body(fmt, call):
    reasoning = "glm45" if fmt == "glm47" else "qwen3"
    # glm ends reasoning at <tool_call>, so its reasoning text holds the tool-call-like text
    # without the tag; the others keep the whole call text inside <think>
    inner = call.replace("<tool_call>", "") if fmt == "glm47" else call
    text = "<think>" + inner + "</think>"
    parser = make_stream_parser(tool_parser=fmt, reasoning=reasoning)
    for ch in text:
        parser.feed(ch)
        assert parser_state(parser) == (False, False, 0)
    out = parser.finish()
    assert parser.tool_calls == [] and "".join(d.reasoning for d in out) == ""
    # the same call after the reasoning span is parsed, with body states
    parser = make_stream_parser(tool_parser=fmt, reasoning=reasoning)
    seen_body = False
    for ch in "<think>plan</think>" + call:
        parser.feed(ch)
        seen_body |= parser.inside_parameter_body and parser.param_body_chars_emitted == 1
    parser.finish()
    assert seen_body and json.loads(parser.tool_calls[0]["arguments"]) == {"a": "x"}
