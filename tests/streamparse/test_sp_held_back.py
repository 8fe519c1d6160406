"""``held_back_len``: the public "hold back a possible partial marker" helper of streamparse."""

from __future__ import annotations

import doctest
import random

import pytest

import metrale_core.streamparse.base as base
from metrale_core.streamparse import held_back_len

MARKERS = ("<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]", "\n</parameter>", "</parameter>")


def _reference(text: str, markers: tuple[str, ...], start: int = 0) -> int:
    """The contract spelled out: the longest suffix of text[start:] that is a proper prefix of
    a marker."""
    tail = text[start:]
    return max((k for k in range(1, len(tail) + 1) for m in markers if k < len(m) and tail.endswith(m[:k])), default=0)


def test_is_exported_publicly():
    import metrale_core.streamparse as sp

    assert "held_back_len" in sp.__all__
    assert sp.held_back_len is base.held_back_len


@pytest.mark.parametrize("markers", [("[ARGS]",), "[ARGS]", MARKERS])
def test_empty_text_holds_nothing_back(markers):
    assert held_back_len("", markers) == 0
    assert held_back_len("", markers, 0) == 0


@pytest.mark.parametrize("marker", MARKERS)
@pytest.mark.parametrize("prefix", ["", "some content ", "<<", "[[", "\n"])
def test_marker_split_at_every_position(marker, prefix):
    for k in range(1, len(marker)):  # every proper prefix is held back, exactly
        assert held_back_len(prefix + marker[:k], (marker,)) == k, (prefix, marker[:k])
        assert held_back_len(prefix + marker[:k], marker) == k
    # the whole marker is not a proper prefix of itself: nothing is held back
    assert held_back_len(prefix + marker, (marker,)) == 0


def test_several_markers_the_longest_suffix_wins():
    # "</" could start "</tool_call>" or "</parameter>"; "\n</" only "\n</parameter>"
    assert held_back_len("x\n</", ("</tool_call>", "\n</parameter>")) == 3
    assert held_back_len("x\n</", ("</tool_call>",)) == 2
    assert held_back_len("x</tool", ("</parameter>", "</tool_call>")) == 6
    assert held_back_len("x</para", ("</parameter>", "</tool_call>")) == 6
    # a complete shorter marker that is a proper prefix of a longer one is still held back
    assert held_back_len("x<a", ("<a", "<ab")) == 2
    assert held_back_len("x<a", ("<a",)) == 0


@pytest.mark.parametrize(
    "text",
    [
        "plain text",
        "a <tool_call> b",
        "[TOOL_CALLS]x",
        "</tool_call>",
        "[ARGS ]",
        "</parameter >",
        "tool_call>",
        "<tool_call>>",
    ],
)
def test_no_marker_prefix_at_the_end(text):
    assert held_back_len(text, MARKERS) == 0


def test_a_single_character_prefix_is_held_back():
    assert held_back_len("ends with <", MARKERS) == 1
    assert held_back_len("ends with [", MARKERS) == 1
    assert held_back_len("ends with \n", MARKERS) == 1


def test_start_limits_the_suffix():
    text = "ab</tool"
    assert held_back_len(text, "</tool_call>") == 6
    assert held_back_len(text, "</tool_call>", start=4) == 0  # only "tool" is looked at: no match
    assert held_back_len("</tool", "</tool_call>", start=2) == 0
    assert held_back_len("xx</", "</tool_call>", start=2) == 2
    assert held_back_len("xx</", "</tool_call>", start=4) == 0
    assert held_back_len("xx</", "</tool_call>", start=10) == 0


def test_no_or_empty_markers_hold_nothing_back():
    assert held_back_len("abc", ()) == 0
    assert held_back_len("abc", ("",)) == 0
    assert held_back_len("ab<", ("", "<x")) == 1


def test_matches_the_contract_on_random_text():
    rng = random.Random(7)
    alphabet = "<>/[]_\n tcolARGSpaem"
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 16)))
        markers = tuple(rng.sample(MARKERS, rng.randrange(1, len(MARKERS) + 1)))
        start = rng.randrange(0, len(text) + 2)
        expected = _reference(text, markers, start)
        assert held_back_len(text, markers, start) == expected, (text, markers, start)


def test_docstring_examples():
    runner = doctest.DocTestRunner()
    for test in doctest.DocTestFinder().find(base.held_back_len, "held_back_len"):
        runner.run(test)
    assert runner.summarize(verbose=False) == (0, 2)
