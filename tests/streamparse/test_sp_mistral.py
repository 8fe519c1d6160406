"""The built-in ``mistral`` parser (once contrib's metrale-mistral-tools): both [TOOL_CALLS] forms,
selected by name, model type or template, chunking-proof, 9-character ids."""

from __future__ import annotations

import json
import random
import re

import pytest
from streamparse_helpers import assert_chunking_invariant

from metrale_core.plugin.discovery import load_registry
from metrale_core.streamparse import StreamParser, ToolCallParser, make_stream_parser
from metrale_core.streamparse.mistral import MistralToolParser

TWO_CALLS = (
    'Let me check both.\n[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": [1, 2],'
    ' "unit": {"t": "C"}, "ok": true}[TOOL_CALLS]get_time[ARGS]{}'
)


@pytest.fixture(scope="module")
def registry():
    return load_registry()


def run(text: str, chunks: list[int] | None = None, tools=None) -> dict:
    """Feed ``text`` in pieces of the given sizes (all at once by default); collect the result."""
    parser = MistralToolParser(tools=tools)
    deltas, i = [], 0
    for size in chunks or [len(text)]:
        deltas += parser.feed(text[i : i + size])
        i += size
    deltas += parser.feed(text[i:])
    deltas += parser.finish()
    calls: dict[int, dict] = {}
    for d in deltas:
        if d.tool_call_index is not None:
            call = calls.setdefault(d.tool_call_index, {"name": None, "arguments": ""})
            call["name"] = d.name if d.name is not None else call["name"]
            call["arguments"] += d.arguments
    return {
        "content": "".join(d.content for d in deltas),
        "calls": calls,
        "completed": [(c.index, c.name, c.arguments) for c in parser.completed_calls],
    }


def random_chunks(rng: random.Random, n: int) -> list[int]:
    sizes = []
    while sum(sizes) < n:
        sizes.append(rng.choice([1, 1, 2, 3, 5, 8, 13]))
    return sizes


def test_built_in(registry):
    spec = registry.tool_call_parsers["mistral"]
    assert registry.provider("tool_call_parsers", "mistral").distribution == "metrale-core"
    assert spec.model_types == ("mistral", "mistral3")
    assert isinstance(spec.factory(tools=None), ToolCallParser)


def test_selected_by_name_and_by_model_type(registry):
    by_name = make_stream_parser(registry, tool_parser="mistral", tools=[])
    by_type = make_stream_parser(registry, model_type="mistral3", tools=[])
    other = make_stream_parser(registry, model_type="qwen3", tools=[])
    assert isinstance(by_name.tool_parser, MistralToolParser)
    assert isinstance(by_type.tool_parser, MistralToolParser)
    assert not isinstance(other.tool_parser, MistralToolParser)
    # the mistral text is a tool call only for the mistral parser
    assert by_name.feed(TWO_CALLS[:-1])[0].content == "Let me check both."
    assert [c["name"] for c in by_name.tool_calls] == ["get_weather"]
    by_name.feed(TWO_CALLS[-1])
    by_name.finish()
    assert [c["name"] for c in by_name.tool_calls] == ["get_weather", "get_time"]
    # Mistral's templates refuse any id but 9 letters/digits when the call comes back
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", c["id"]) for c in by_name.tool_calls)
    other.feed(TWO_CALLS)
    other.finish()
    assert other.tool_calls == []


def test_two_calls_parse():
    result = run(TWO_CALLS)
    assert result["content"] == "Let me check both."
    assert [c["name"] for c in result["calls"].values()] == ["get_weather", "get_time"]
    first = json.loads(result["calls"][0]["arguments"])
    assert first == {"city": "Paris", "days": [1, 2], "unit": {"t": "C"}, "ok": True}
    assert result["calls"][1]["arguments"] == "{}"
    assert [c[:2] for c in result["completed"]] == [(0, "get_weather"), (1, "get_time")]


MALFORMED = [
    "Sure.[TOOL_CALLS]get weather[ARGS]{}",  # a space in the name
    'Sure.[TOOL_CALLS]get_weather{"city": 1}',  # no [ARGS]
    'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": Paris}',  # invalid JSON
    "Sure.[TOOL_CALLS]get_weather[ARGS][1, 2]",  # not an object
    'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Pa',  # the stream ends inside
    'Sure.[TOOL_CALLS][{"name": "f", "arguments": {}}',  # the v3 form, cut short
    'Sure.[TOOL_CALLS][{"name": "f", "arguments": [1]}]',  # v3: arguments not an object
    'Sure.[TOOL_CALLS][{"name": "f", "oops": 1}]',  # v3: an unknown key
    "Sure.[TOOL_CALLS][]",  # v3: no call
]


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_calls_come_back_as_content(text):
    result = run(text)
    assert result["content"] == text
    assert result["completed"] == []
    assert all(call["arguments"] == "" for call in result["calls"].values())


def test_a_good_call_after_a_bad_one_still_parses():
    result = run('[TOOL_CALLS]f[ARGS]{"a": nope}[TOOL_CALLS]g[ARGS]{"b": 2}')
    assert result["content"] == '[TOOL_CALLS]f[ARGS]{"a": nope}'
    assert result["completed"] == [(1, "g", '{"b": 2}')]  # index 0 was used by f's header


@pytest.mark.parametrize(
    "text",
    [
        TWO_CALLS,
        "plain text with [brackets] and [TOOL_CALL",
        "a [TOOL_CALLS]x[AR",
        *MALFORMED,
        'x[TOOL_CALLS]f[ARGS]{"s": "}{\\"]["}  trailing',
    ],
)
def test_random_chunking_gives_the_same_result(text):
    whole = run(text)
    rng = random.Random(hash(text) & 0xFFFF)
    for _ in range(100):
        assert run(text, random_chunks(rng, len(text))) == whole
    assert run(text, [1] * len(text)) == whole


def test_b1_state_follows_the_argument_bodies():
    parser = MistralToolParser()
    text = '[TOOL_CALLS]f[ARGS]{"city": "Paris", "n": 42, "o": {"k": 1}}'
    states = []
    for ch in text:
        parser.feed(ch)
        states.append((ch, parser.inside_tool_call, parser.inside_parameter_body, parser.param_body_chars_emitted))
    # the characters after which the parser is inside a body: a string's opening quote opens
    # it and its closing quote closes it; a number's first digit opens it; a brace opens an
    # object body and its matching brace closes it; keys, ':' and ', ' are outside
    body = "".join(ch for ch, _, inside, _ in states if inside)
    assert body == '"Paris42{"k": 1'
    counts = [n for _, _, inside, n in states if inside]
    assert counts[:6] == [0, 1, 2, 3, 4, 5]  # "P..s counted as they are consumed
    assert not states[0][1] and states[len("[TOOL_CALLS]")][1]
    parser.finish()
    assert not parser.inside_tool_call and not parser.inside_parameter_body


def test_stream_parser_keeps_reasoning_apart(registry):
    parser = make_stream_parser(registry, tool_parser="mistral", reasoning="qwen3", tools=[])
    assert isinstance(parser, StreamParser)
    deltas = parser.feed("<think>maybe [TOOL_CALLS]no[ARGS]{}</think>ok[TOOL_CALLS]yes[ARGS]{}")
    deltas += parser.finish()
    assert "".join(d.reasoning for d in deltas) == "maybe [TOOL_CALLS]no[ARGS]{}"
    assert [c["name"] for c in parser.tool_calls] == ["yes"]


def test_parser_builds_on_the_public_tag_parser_base():
    """feed / finish, content and fallback come from the core's TagParserBase, not a copy."""
    from metrale_core.api import TagParserBase

    assert issubclass(MistralToolParser, TagParserBase)
    for method in ("feed", "finish", "_content", "_fallback", "_drive"):
        assert method not in vars(MistralToolParser), method


def test_v3_form_of_mistral_nemo_with_ids_and_several_calls():
    text = (
        'Checking.[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abc123XYZ"}, '
        '{"name": "get_time", "arguments": "{\\"tz\\": \\"CET\\"}", "id": "def456UVW"}]'
    )
    got = assert_chunking_invariant(text, tool_parser="mistral", tools=[])
    assert got.content == "Checking."
    assert [(n, json.loads(a)) for n, a in got.tool_calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {"tz": "CET"}),
    ]


def test_small_3_2_call_id_variant():
    got = assert_chunking_invariant(
        '[TOOL_CALLS]get_weather[CALL_ID]abc123XYZ[ARGS]{"city": "Oslo"}', tool_parser="mistral"
    )
    assert got.tool_calls == [("get_weather", '{"city": "Oslo"}')] and got.content == ""


def test_picked_by_a_mistral_template():
    nemo = "{{- '[TOOL_CALLS][' }}{%- for tool_call in message.tool_calls %}"
    parser = make_stream_parser(tools=[], chat_template=nemo, model_type="llama")
    assert isinstance(parser.tool_parser, MistralToolParser) and parser.keeps_special_tokens
