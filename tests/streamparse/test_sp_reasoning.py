"""Reasoning split (<think>…</think>), parser selection and StreamParser plumbing."""

from __future__ import annotations

import json

import pytest
from streamparse_helpers import assert_chunking_invariant

from metrale_core.errors import ConfigError
from metrale_core.plugin.discovery import load_registry
from metrale_core.streamparse import (
    StreamParserClosed,
    default_reasoning,
    make_stream_parser,
)
from metrale_core.streamparse.glm47 import Glm47Parser
from metrale_core.streamparse.hermes import HermesParser
from metrale_core.streamparse.qwen3_coder import Qwen3CoderParser
from metrale_core.streamparse.reasoning import MAX_LEADING_WS

CALL = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'


@pytest.mark.parametrize(
    "text, reasoning, content, starts",
    [
        ("<think>\nstep 1\n</think>\n\nAnswer.", "\nstep 1\n", "\n\nAnswer.", False),
        ("  \n<think>r</think>A", "r", "A", False),  # whitespace before <think>
        ("Answer <think>not reasoning</think>", "", "Answer <think>not reasoning</think>", False),
        ("<thinking>is content", "", "<thinking>is content", False),
        ("already thinking</think>Answer", "already thinking", "Answer", True),
        ("thinks to the end", "thinks to the end", "", True),
        ("<think>unclosed", "unclosed", "", False),
        ("</think>", "", "", True),
        ("", "", "", False),
        ("  ", "", "  ", False),
    ],
)
def test_reasoning_split(text, reasoning, content, starts):
    got = assert_chunking_invariant(text, tool_parser="none", reasoning="qwen3", starts_in_reasoning=starts)
    assert (got.reasoning, got.content) == (reasoning, content)


@pytest.mark.parametrize(
    "text, reasoning, content",
    [
        ("<think>Plan.</think>\n<response>The answer.</response>", "Plan.", "The answer."),
        ("<think>a</think><response>x</response> tail", "a", "x tail"),
        ("<think>a</think> no tags</response>", "a", " no tags</response>"),  # only an opened answer closes
        ("<think>a</think><response>cut short", "a", "cut short"),
        ("<response>no reasoning</response>", "", "<response>no reasoning</response>"),
        ("plain", "", "plain"),
    ],
)
def test_granite_answer_tags_are_dropped_after_reasoning(text, reasoning, content):
    got = assert_chunking_invariant(text, tool_parser="none", reasoning="granite")
    assert (got.reasoning, got.content) == (reasoning, content)
    assert default_reasoning("granite") == "granite"


def test_granite_tool_call_inside_the_answer():
    text = '<think>Need it.</think><response><|tool_call|>[{"name": "f", "arguments": {"a": 1}}]</response>'
    got = assert_chunking_invariant(text, tool_parser="granite", reasoning="granite")
    assert got.reasoning == "Need it." and got.content == "" and got.tool_calls == [("f", '{"a": 1}')]


def test_long_leading_whitespace_is_content():
    text = " " * (MAX_LEADING_WS + 1) + "<think>x</think>"
    got = assert_chunking_invariant(text, trials=20, tool_parser="none", reasoning="qwen3")
    assert got.content == text and got.reasoning == ""


def test_tool_calls_inside_reasoning_are_reasoning():
    text = "<think>maybe " + CALL + "?</think>\n\n" + CALL
    got = assert_chunking_invariant(text, tool_parser="hermes", reasoning="qwen3")
    assert got.reasoning == "maybe " + CALL + "?"
    assert got.content == "" and got.tool_calls == [("f", '{"a": 1}')]


def test_glm_tool_call_also_ends_reasoning():
    text = "planning<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>"
    got = assert_chunking_invariant(text, tool_parser="glm47", reasoning="glm45", starts_in_reasoning=True)
    assert got.reasoning == "planning" and got.tool_calls == [("f", '{"a": "1"}')]
    # the plain <think> format keeps <tool_call> inside the reasoning
    got = assert_chunking_invariant(text, tool_parser="glm47", reasoning="qwen3", starts_in_reasoning=True)
    assert got.reasoning == text and got.tool_calls == []


def test_without_reasoning_think_tags_are_content():
    got = assert_chunking_invariant("<think>x</think>y", tool_parser="none")
    assert got.content == "<think>x</think>y" and got.reasoning == ""


def test_parser_choice_by_name_model_type_and_registry():
    reg = load_registry()
    assert set(reg.tool_call_parsers) >= {"hermes", "qwen3_coder", "glm47"}
    for registry in (None, reg):
        assert isinstance(make_stream_parser(registry).tool_parser, HermesParser)
        assert isinstance(make_stream_parser(registry, model_type="qwen3").tool_parser, HermesParser)
        assert isinstance(make_stream_parser(registry, model_type="glm5_next").tool_parser, Glm47Parser)
        assert isinstance(make_stream_parser(registry, model_type="qwen3_coder").tool_parser, Qwen3CoderParser)
        assert isinstance(
            make_stream_parser(registry, tool_parser="glm47", model_type="qwen3").tool_parser, Glm47Parser
        )
        assert make_stream_parser(registry, tool_parser="none").tool_parser is None
        with pytest.raises(
            ConfigError, match=r"no tool-call parser named 'xml'.*glm47, .*harmony, hermes, .*qwen3_coder"
        ):
            make_stream_parser(registry, tool_parser="xml")
    with pytest.raises(ConfigError, match="unknown reasoning format 'r1'"):
        make_stream_parser(reasoning="r1")
    assert default_reasoning("qwen3") == "qwen3" and default_reasoning("glm5_next") == "glm45"
    assert default_reasoning("llama") is None
    auto = make_stream_parser(reasoning="auto", model_type="glm5_next")
    assert auto.reasoning.format.handover_tags == ("<tool_call>",)
    assert make_stream_parser(reasoning="auto", model_type="llama").reasoning is None


def test_feed_after_finish_is_an_error_and_finish_is_idempotent():
    parser = make_stream_parser(reasoning="qwen3")
    parser.feed("<think>a")
    assert [d.reasoning for d in parser.finish()] == []  # "a" was already emitted
    assert parser.finish() == []
    with pytest.raises(StreamParserClosed, match="after finish"):
        parser.feed("more")


def test_deltas_are_merged_per_kind():
    parser = make_stream_parser(reasoning="qwen3")
    out = parser.feed("<think>a</think>b" + CALL + CALL) + parser.finish()
    kinds = [("r" if d.reasoning else "c" if d.content else d.tool_call_index) for d in out]
    assert kinds == ["r", "c", 0, 1]
    assert [json.loads(d.arguments) for d in out[2:]] == [{"a": 1}, {"a": 1}]
    assert out[2].tool_call_id != out[3].tool_call_id
    assert parser.tool_calls[1]["id"] == out[3].tool_call_id
