"""Body detection per tool-call format (hermes, qwen3_coder, glm47) under random chunking, through
the real ``StreamParser``: after every chunk (one sampled position whose gap is 1.0) the observer
counts exactly when the text fed so far ends inside a parameter value that already has a
committed character.

For a value occupying ``text[s:e]`` whose closing delimiter ends at ``c``, a prefix of length
``p`` must count for ``s < p <= e``; it may count for ``e < p < c`` (a partial closing tag is
held back, so the parser is still inside); it must not count anywhere else (content, reasoning,
names, keys, tags, between values, or at ``p == s`` with nothing emitted).
"""

from __future__ import annotations

import random

import pytest
from b1_testlib import Row, gap_logits

from metrale_b1.b1_margin import B1MarginObserver, B1Stats
from metrale_core.streamparse import make_stream_parser

THINK = '<think>\nMaybe <tool_call>\n{"name": "x", "arguments": {"a": "zzz"}}\n</tool_call>\n</think>\n\n'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "note": {"type": "string"}},
            },
        },
    }
]

#: format -> (reasoning format, text, [(value, closing delimiter)] in order of appearance)
CASES = {
    "hermes": (
        "qwen3",
        THINK + 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris", "days": 12, "note": "say \\"hi\\" now"}}\n</tool_call>',
        [("Paris", '"'), ("12", ","), ('say \\"hi\\" now', '"')],
    ),
    "qwen3_coder": (
        "qwen3",
        THINK + "Let me check.<tool_call>\n<function=get_weather>\n<parameter=city>\n"
        "Paris\n</parameter>\n<parameter=days>\n12\n</parameter>\n<parameter=note>\n"
        "two\nlines\n</parameter>\n</function>\n</tool_call>",
        [("Paris", "\n</parameter>"), ("12", "\n</parameter>"), ("two\nlines", "\n</parameter>")],
    ),
    "glm47": (
        "glm45",
        THINK + "Let me check.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris"
        "</arg_value><arg_key>days</arg_key><arg_value>12</arg_value><arg_key>note</arg_key>"
        "<arg_value>a b</arg_value></tool_call>",
        [("Paris", "</arg_value>"), ("12", "</arg_value>"), ("a b", "</arg_value>")],
    ),
}


def spans(text: str, values: list[tuple[str, str]]) -> list[tuple[int, int, int]]:
    """``(s, e, c)`` of each value, searched after the reasoning block."""
    out, at = [], text.index("</think>")
    for value, close in values:
        s = text.index(value, at)
        e = s + len(value)
        assert text.startswith(close, e)
        out.append((s, e, e + len(close)))
        at = e
    return out


def chunks(text: str, rng: random.Random) -> list[str]:
    out, i = [], 0
    while i < len(text):
        n = rng.randint(1, 7)
        out.append(text[i : i + n])
        i += n
    return out


@pytest.mark.parametrize("fmt", sorted(CASES))
def test_counted_exactly_inside_values_under_random_chunking(fmt):
    reasoning, text, values = CASES[fmt]
    bodies = spans(text, values)
    logits = gap_logits(1, gap=1.0)
    hits = dict.fromkeys(bodies, 0)
    for seed in range(40):
        rng = random.Random(seed)
        stats = B1Stats()
        observer = B1MarginObserver(stats)
        parser = make_stream_parser(tool_parser=fmt, reasoning=reasoning, tools=TOOLS)
        row = Row(parser)
        ctx = type("Ctx", (), {"rows": [row]})()
        fed = 0
        for piece in chunks(text, rng) if seed else list(text):  # seed 0: one character a token
            parser.feed(piece)
            fed += len(piece)
            before = stats.b1_low_margin
            observer(logits, ctx)
            counted = stats.b1_low_margin - before
            must = any(s < fed <= e for s, e, _ in bodies)
            may = must or any(e < fed < c for _, e, c in bodies)
            assert counted == 1 if must else counted == 0 or may, (fmt, seed, fed, text[:fed])
            for b in bodies:
                hits[b] += counted and b[0] < fed < b[2]
        parser.finish()
        assert len(parser.tool_calls) == 1 and parser.tool_calls[0]["name"] == "get_weather"
    assert all(hits.values()), hits  # every value was seen from inside


@pytest.mark.parametrize("fmt", sorted(CASES))
def test_one_character_per_position_counts_every_value_character(fmt):
    """Fed one character at a time, each value of n characters is counted at n positions (plus
    the positions while its closing tag is still a held-back prefix)."""
    reasoning, text, values = CASES[fmt]
    stats = B1Stats()
    observer = B1MarginObserver(stats)
    parser = make_stream_parser(tool_parser=fmt, reasoning=reasoning, tools=TOOLS)
    ctx = type("Ctx", (), {"rows": [Row(parser)]})()
    counted_at = []
    for fed, ch in enumerate(text, start=1):
        parser.feed(ch)
        before = stats.b1_low_margin
        observer(gap_logits(1), ctx)
        if stats.b1_low_margin > before:
            counted_at.append(fed)
    expected = []
    for s, e, c in spans(text, values):
        expected += [p for p in counted_at if s < p < c]
        assert all(p in counted_at for p in range(s + 1, e + 1))
    assert counted_at == expected
