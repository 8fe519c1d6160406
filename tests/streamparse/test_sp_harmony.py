"""gpt-oss's harmony output: analysis -> reasoning, commentary to=functions.NAME -> tool calls,
final -> content; any split of the text gives the same result; bad output degrades to content."""

from __future__ import annotations

import json

import pytest
from streamparse_helpers import assert_chunking_invariant, parse

from metrale_core.streamparse import make_stream_parser
from metrale_core.streamparse.harmony import MAX_HEADER, HarmonyParser
from metrale_core.streamparse.parser import default_reasoning

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
ANALYSIS = "<|channel|>analysis<|message|>The user wants the weather; call the tool.<|end|>"
CALL = '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
FINAL = "<|channel|>final<|message|>It is sunny in Paris, 21 °C.<|return|>"
#: what a gpt-oss template renders before the model's turn (the parser sees only what follows)
GPT_OSS_TEMPLATE_BITS = (
    '{{- "<|start|>assistant to=" }}{{- "functions." + name + "<|channel|>commentary " }}<|message|>'
)


def harmony(text: str, tools=TOOLS, **kwargs):
    return assert_chunking_invariant(text, tool_parser="harmony", tools=tools, **kwargs)


def test_reasoning_then_a_call_ended_by_call_token():
    got = harmony(ANALYSIS + CALL + "<|call|>")
    assert got.reasoning == "The user wants the weather; call the tool."
    assert got.content == ""
    assert got.calls == {0: ("get_weather", '{"city": "Paris"}')}
    assert got.tool_calls == [("get_weather", '{"city": "Paris"}')]


def test_a_call_whose_end_token_was_the_eos_is_complete():
    """<|call|> is an end-of-generation token: the engine stops and the text never shows it."""
    got = harmony(ANALYSIS + CALL)
    assert got.tool_calls == [("get_weather", '{"city": "Paris"}')]


def test_recipient_before_the_channel_and_a_plain_content_type():
    text = '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Oslo"}<|call|>'
    got = harmony(text)
    assert got.tool_calls == [("get_weather", '{"city": "Oslo"}')] and got.content == got.reasoning == ""


def test_final_answer_after_reasoning_and_nothing_after_return():
    got = harmony("<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant" + FINAL + "<|start|>user junk")
    assert got.reasoning == "Easy."
    assert got.content == "It is sunny in Paris, 21 °C."
    assert got.calls == {}


def test_a_preamble_on_commentary_is_content_and_two_calls_count_up():
    text = (
        "<|channel|>commentary<|message|>Checking two cities.<|end|>"
        + CALL
        + "<|end|>"
        + CALL.replace("Paris", "Rome")
        + "<|call|>"
    )
    got = harmony(text)
    assert got.content == "Checking two cities."
    assert [json.loads(a) for _, a in got.tool_calls] == [{"city": "Paris"}, {"city": "Rome"}]
    assert sorted(got.calls) == [0, 1]


def test_without_tool_parsing_a_call_is_content_and_reasoning_is_still_split():
    """tool_choice none / no tools: the server asks for reasoning only (``reasoning="harmony"``)."""
    text = ANALYSIS + CALL + "<|call|>"
    got = assert_chunking_invariant(text, tool_parser="none", reasoning="harmony")
    assert got.reasoning == "The user wants the weather; call the tool."
    assert got.calls == {}
    assert got.content == CALL  # the raw message, header included (its end token is not text)


@pytest.mark.parametrize(
    "body",
    ['{"city": Paris}', "[1, 2]", '{"city": "Pa', ""],
    ids=["invalid-json", "not-an-object", "cut-short", "empty"],
)
def test_malformed_call_degrades_to_content(body):
    header = "<|channel|>commentary to=functions.get_weather <|constrain|>json"
    got = harmony(ANALYSIS + "<|start|>assistant" + header + "<|message|>" + body + "<|call|>")
    assert got.tool_calls == []
    assert got.reasoning.startswith("The user wants")
    # the whole call text comes back, and no call (not even its name) was streamed
    assert got.content == "<|start|>assistant" + header + "<|message|>" + body + "<|call|>"
    assert got.calls == {}


def test_whitespace_around_a_malformed_call_stays_in_place():
    bad = "<|start|>assistant<|channel|>commentary to=functions.get_weather<|message|> {nope} <|end|>"
    got = harmony(bad + "<|start|>assistant<|channel|>final<|message|> Hi \n")
    assert got.content == bad + " Hi \n"


def test_a_call_to_a_builtin_tool_is_content():
    text = (
        "<|channel|>analysis<|message|>search<|end|>"
        '<|start|>assistant<|channel|>commentary to=browser.search json<|message|>{"q": 1}<|call|>'
    )
    got = harmony(text)
    assert got.tool_calls == [] and got.reasoning == "search"
    assert got.content == '<|start|>assistant<|channel|>commentary to=browser.search json<|message|>{"q": 1}'


@pytest.mark.parametrize("text", ["Hello there, no channels at all.", "x" * (MAX_HEADER + 50) + "<|message|>y"])
def test_text_that_is_not_harmony_is_content_unchanged(text):
    got = harmony(text)
    assert got.content == text and got.reasoning == "" and got.calls == {}


def test_reasoning_state_follows_the_analysis_body():
    parser = make_stream_parser(tool_parser="harmony", tools=TOOLS)
    parser.feed("<|channel|>analysis<|mess")
    assert not parser.in_reasoning
    parser.feed("age|>hm")
    assert parser.in_reasoning and not parser.inside_tool_call
    parser.feed("m<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather<|message|>{")
    assert not parser.in_reasoning and parser.inside_tool_call
    parser.feed('"city": "X"}')
    out = parser.finish()
    assert not parser.inside_tool_call
    assert "".join(d.arguments for d in out) == '{"city": "X"}'


def test_picked_by_the_template_and_by_model_type():
    by_template = make_stream_parser(tools=TOOLS, chat_template=GPT_OSS_TEMPLATE_BITS)
    by_type = make_stream_parser(tools=TOOLS, model_type="gpt_oss")
    reasoning_only = make_stream_parser(tool_parser="none", reasoning="auto", model_type="gpt_oss")
    for parser in (by_template, by_type, reasoning_only):
        assert isinstance(parser.tool_parser, HarmonyParser) and parser.reasoning is None
        assert parser.keeps_special_tokens
    assert by_template.tool_parser.parse_calls and not reasoning_only.tool_parser.parse_calls
    assert default_reasoning(None, GPT_OSS_TEMPLATE_BITS) == "harmony"
    assert default_reasoning("gpt_oss") == "harmony"
    assert default_reasoning("qwen3", "<|im_start|>") == "qwen3"


def test_every_split_of_a_whole_turn_streams_the_same_pieces_in_order():
    """Not just the totals: reasoning always comes before the call and the call's header first."""
    text = ANALYSIS + CALL + "<|call|>"
    for cut in range(1, len(text)):
        got, _ = parse([text[:cut], text[cut:]], tool_parser="harmony", tools=TOOLS)
        assert got.reasoning.endswith("tool.") and got.tool_calls == [("get_weather", '{"city": "Paris"}')]
