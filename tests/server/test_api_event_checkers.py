"""The event-order checkers of ``api_events`` fail on a missing, extra or reordered event: each
valid sequence recorded from the real server is mutated (every single event dropped, every
adjacent pair swapped, ``event:`` lines stripped) and every mutation must be rejected.  The
official clients agree where they can tell: ``responses.stream()`` raises on the same broken
orders, and the ``anthropic`` client yields nothing from a stream without ``event:`` lines."""

from __future__ import annotations

import json

import httpx
import pytest
from api_events import check_messages_stream, check_responses_stream, parse_sse
from server_testlib import messages_sse

TOOL = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
ATOOL = {"name": "get_weather", "input_schema": TOOL["parameters"]}


def _render(events, with_names=True):
    out = []
    for name, data in events:
        head = f"event: {name}\n" if with_names and name else ""
        out.append(f"{head}data: {json.dumps(data)}\n\n")
    return "".join(out)


def _mutations(events):
    """Drop each event (but pings), swap each adjacent pair of different types."""
    for i in range(len(events)):
        if events[i][0] != "ping":
            yield f"drop {events[i][1]['type']}", events[:i] + events[i + 1 :]
    for i in range(len(events) - 1):
        if events[i][1]["type"] != events[i + 1][1]["type"] and "ping" not in (events[i][0], events[i + 1][0]):
            swapped = list(events)
            swapped[i], swapped[i + 1] = swapped[i + 1], swapped[i]
            yield f"swap {events[i][1]['type']}/{events[i + 1][1]['type']}", swapped


def _renumber(events):
    return [(n, {**d, "sequence_number": k}) for k, (n, d) in enumerate(events)]


@pytest.mark.parametrize("prompt", ["What is the weather in Paris?", "Please ponder 2+2."])
def test_responses_checker_rejects_every_mutation(base_url, prompt):
    raw = httpx.post(
        base_url + "/v1/responses",
        json={"model": "scripted", "input": prompt, "stream": True, "tools": [TOOL]},
        timeout=60,
    ).text
    events = parse_sse(raw)
    check_responses_stream(events)
    for label, mutated in _mutations(events):
        # renumbered, so only the order itself can give it away
        with pytest.raises(AssertionError):
            check_responses_stream(_renumber(mutated))
            pytest.fail(f"checker accepted: {label}")


def test_openai_stream_helper_rejects_a_content_event_before_its_item(base_url):
    """The official helper's own ordering rule, on our real events with one moved."""
    import openai
    from openai._models import construct_type_unchecked
    from openai.lib.streaming.responses._responses import ResponseStreamState
    from openai.types.responses import ResponseStreamEvent

    raw = httpx.post(
        base_url + "/v1/responses",
        json={"model": "scripted", "input": "What is the capital of France?", "stream": True},
        timeout=60,
    ).text
    events = [d for _, d in parse_sse(raw)]

    def replay(seq):
        state = ResponseStreamState(input_tools=openai.omit, text_format=openai.omit)
        for data in seq:
            state.handle_event(construct_type_unchecked(type_=ResponseStreamEvent, value=data))
        return state

    replay(events)
    added = next(i for i, d in enumerate(events) if d["type"] == "response.output_item.added")
    broken = events[:added] + events[added + 1 :]
    with pytest.raises(RuntimeError):
        replay(broken)


@pytest.mark.parametrize("prompt", ["What is the weather in Paris?", "Please ponder 2+2."])
def test_messages_checker_rejects_every_mutation(base_url, prompt):
    thinking = {"type": "enabled", "budget_tokens": 64}
    raw = messages_sse(base_url, [{"role": "user", "content": prompt}], 128, tools=[ATOOL], thinking=thinking)
    events = parse_sse(raw)
    blocks = check_messages_stream(events)
    for label, mutated in _mutations(events):
        # a dropped delta keeps the order valid but loses content: compare what it builds
        with pytest.raises(AssertionError):
            assert check_messages_stream(mutated) == blocks
            pytest.fail(f"checker accepted: {label}")
    with pytest.raises(AssertionError):
        check_messages_stream(parse_sse(_render(events, with_names=False)))


def test_anthropic_client_sees_nothing_without_event_lines(base_url):
    """Why the ``event:`` lines matter: the client silently drops events without them."""
    import anthropic

    httpx2 = pytest.importorskip("httpx2")  # the transport of anthropic >= 2

    raw = messages_sse(base_url, [{"role": "user", "content": "capital"}], 64)
    events = parse_sse(raw)

    def client_events(text):
        transport = httpx2.MockTransport(
            lambda req: httpx2.Response(200, content=text.encode(), headers={"content-type": "text/event-stream"})
        )
        c = anthropic.Anthropic(
            base_url="http://mock", api_key="x", max_retries=0, http_client=httpx2.Client(transport=transport)
        )
        with c.messages.create(
            model="m", max_tokens=8, stream=True, messages=[{"role": "user", "content": "x"}]
        ) as stream:
            return [e.type for e in stream]

    assert client_events(_render(events))[0] == "message_start"
    assert client_events(_render(events, with_names=False)) == []
