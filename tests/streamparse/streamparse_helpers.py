"""Helpers for the stream-parser tests: collecting deltas, random chunking, B1 state markers."""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable

from attrs import frozen

from metrale_core.streamparse import make_stream_parser

#: OpenAI-style ids, or the 9 letters and digits of the mistral parser.
ID = re.compile(r"call_[0-9a-f]{16}|[A-Za-z0-9]{9}")


@frozen
class Collected:
    content: str
    reasoning: str
    #: index -> (name, arguments)
    calls: dict
    #: the completed, well-formed calls: [(name, arguments)]
    tool_calls: list


def collect(deltas, parser=None) -> Collected:
    """Concatenate a delta stream; check the per-call header rules on the way."""
    content, reasoning, calls, ids = [], [], {}, {}
    for d in deltas:
        assert not (d.content and d.tool_call_index is not None), d
        assert not (d.reasoning and (d.content or d.tool_call_index is not None)), d
        content.append(d.content)
        reasoning.append(d.reasoning)
        if d.tool_call_index is None:
            assert d.name is None and d.tool_call_id is None and not d.arguments, d
            continue
        i = d.tool_call_index
        if i not in calls:
            assert d.name and ID.fullmatch(d.tool_call_id), f"first piece of call {i} lacks a header: {d}"
            assert i == len(calls), f"call indices must count up from 0, got {i} after {list(calls)}"
            calls[i] = [d.name, ""]
            ids[i] = d.tool_call_id
        else:
            assert d.name is None and d.tool_call_id is None, f"header repeated for call {i}: {d}"
        calls[i][1] += d.arguments
    tool_calls = []
    if parser is not None:
        for tc in parser.tool_calls:
            assert ID.fullmatch(tc["id"])
            tool_calls.append((tc["name"], tc["arguments"]))
        assert len({tc["id"] for tc in parser.tool_calls}) == len(parser.tool_calls)
    return Collected("".join(content), "".join(reasoning), {i: tuple(v) for i, v in calls.items()}, tool_calls)


def random_pieces(text: str, rng: random.Random) -> list[str]:
    """Split ``text`` at random points: single characters, short and long multi-char deltas."""
    pieces, i = [], 0
    while i < len(text):
        n = rng.choice((1, 1, 1, 2, 3, 4, 5, 7, 12, 40))
        pieces.append(text[i : i + n])
        i += n
    return pieces


def parse(pieces, **kwargs):
    """Feed ``pieces`` to a fresh parser built with ``kwargs``; returns (Collected, parser)."""
    parser = make_stream_parser(**kwargs)
    deltas = []
    for piece in pieces:
        deltas += parser.feed(piece)
    deltas += parser.finish()
    return collect(deltas, parser), parser


def assert_chunking_invariant(text: str, trials: int = 150, seed: int = 0, **kwargs) -> Collected:
    """One-shot, char-by-char and ``trials`` random splits all give the same result."""
    whole, _ = parse([text], **kwargs)
    chars, _ = parse(list(text), **kwargs)
    assert chars == whole
    rng = random.Random(seed)
    for _ in range(trials):
        pieces = random_pieces(text, rng)
        got, _ = parse(pieces, **kwargs)
        assert got == whole, f"split {pieces!r}"
    return whole


# --- B1 state markers --------------------------------------------------------------------------
# In a marked script, markers sit between characters and say what the state is for the prefix
# that ends there (the parser has been fed exactly that prefix):
#   ⦃ / ⦄   inside_tool_call becomes True / False from here on
#   ⟦      a body opens here: inside_parameter_body, 0 characters
#   ⊕      a body opens with the next character, which counts (this prefix is still outside)
#   ·      the next character is inside the body but not counted
#   ⟧      the count stops (a held-back closing tag follows); still inside the body
#   †      the body is closed from here on
MARKERS = "⦃⦄⟦⊕·⟧†"


def expected_states(marked: str) -> tuple[str, list[tuple[bool, bool, int]]]:
    """(text, [(inside_tool_call, inside_parameter_body, chars) for every prefix length])."""
    text, states = [], [(False, False, 0)]
    call, mode, count, skip = False, "out", 0, False
    for ch in marked:
        if ch == "⦃":
            call = True
        elif ch == "⦄":
            call = False
        elif ch == "⟦":
            mode, count = "in", 0
        elif ch == "⊕":
            mode, count, skip = "next", 0, False
        elif ch == "·":
            skip = True
        elif ch == "⟧":
            mode = "frozen"
        elif ch == "†":
            mode, count = "out", 0
        else:
            text.append(ch)
            if mode == "next":
                mode, count = "in", 1
            elif mode == "in":
                if skip:
                    skip = False
                else:
                    count += 1
            states.append(None)
        state = (call, mode != "out" and mode != "next", count if mode not in ("out", "next") else 0)
        states[-1] = state
    return "".join(text), states


def parser_state(parser) -> tuple[bool, bool, int]:
    return (parser.inside_tool_call, parser.inside_parameter_body, parser.param_body_chars_emitted)


def assert_linear_time(run: Callable[[int], object], n: int, factor: int = 4) -> None:
    """``run(size)`` costs about ``factor`` times more CPU at ``factor * n`` than at ``n``, not
    ``factor ** 2``: the larger run must stay under twice the linear estimate.  CPU time of the
    calling thread only (``thread_time``: the session's in-process servers and engine threads
    spend CPU in this process too, and ``process_time`` counted theirs), the better of two runs
    of each size, so a busy machine slows both alike and no wall-clock limit is asserted."""

    def cpu(size: int) -> float:
        start = time.thread_time()
        run(size)
        return time.thread_time() - start

    small = min(cpu(n), cpu(n))  # the better of two: warm caches, no first-call costs
    large = min(cpu(factor * n), cpu(factor * n))
    assert large < 2 * factor * small + 0.05, (
        f"{factor}x the input cost {large / max(small, 1e-9):.1f}x the CPU "
        f"(linear: ~{factor}x, quadratic: ~{factor**2}x)"
    )
