"""Checkers for the streamed event sequences of the Messages and Responses APIs.

Each checker takes the raw SSE text of one response and raises ``AssertionError`` naming the
first event that is missing, extra or out of order -- the orders the official clients rely on
(``anthropic``'s accumulator, ``openai``'s ``responses.stream()`` helper).  They are tested
against mutated sequences in ``test_api_event_checkers.py``, so they can fail.
"""

from __future__ import annotations

import json


def parse_sse(text: str) -> list[tuple[str | None, dict]]:
    """``(event name or None, data)`` per SSE event."""
    events = []
    for block in text.strip().split("\n\n"):
        name, data = None, None
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data = line[len("data: ") :]
        if data is not None and data != "[DONE]":
            events.append((name, json.loads(data)))
    return events


def check_messages_stream(events: list[tuple[str | None, dict]]) -> list[dict]:
    """Assert the Anthropic order; returns the content blocks the deltas build (a ``tool_use``
    block also carries ``json_text``, its fragments concatenated)."""
    assert events, "no events"
    for name, data in events:
        assert name is not None, f"event without an 'event:' line: {data}"
        assert name == data["type"], f"event line {name!r} does not match type {data['type']!r}"
    names = [name for name, _ in events if name != "ping"]
    assert names[0] == "message_start", f"first event is {names[0]}, not message_start"
    assert names[-1] == "message_stop", f"last event is {names[-1]}, not message_stop"
    assert names[-2] == "message_delta", f"message_delta missing before message_stop: {names[-2]}"
    assert names.count("message_start") == 1 and names.count("message_delta") == 1
    start = events[0][1]["message"]
    assert start["usage"]["input_tokens"] > 0, "message_start carries no input token count"
    blocks: list[dict] = []
    open_index = None
    for name, data in events[1:]:
        if name in ("ping", "message_delta", "message_stop"):
            if name != "ping":
                assert open_index is None, f"{name} while block {open_index} is open"
            continue
        if name == "content_block_start":
            assert open_index is None, f"block {data['index']} starts while {open_index} is open"
            assert data["index"] == len(blocks), f"block index {data['index']} out of order"
            blocks.append(dict(data["content_block"], _json=""))
            open_index = data["index"]
        elif name == "content_block_delta":
            assert data["index"] == open_index, f"delta for block {data['index']} not open"
            block, delta = blocks[open_index], data["delta"]
            kind = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "tool_use"}[delta["type"]]
            assert block["type"] == kind, f"{delta['type']} in a {block['type']} block"
            if kind == "tool_use":
                block["_json"] += delta["partial_json"]
            else:
                block[kind] += delta[kind]
        elif name == "content_block_stop":
            assert data["index"] == open_index, f"stop for block {data['index']} not open"
            open_index = None
        else:
            raise AssertionError(f"unexpected event {name}")
    assert open_index is None, f"block {open_index} never stopped"
    for block in blocks:
        if block["type"] == "tool_use":
            try:
                block["input"] = json.loads(block["_json"]) if block["_json"] else {}
            except ValueError as exc:
                raise AssertionError(f"input_json_delta fragments are not JSON: {block['_json']!r}") from exc
            block["json_text"] = block["_json"]
        del block["_json"]
    return blocks


def check_responses_stream(events: list[tuple[str | None, dict]]) -> dict:
    """Assert the Responses order; returns the final response object."""
    assert events, "no events"
    types = [data["type"] for _, data in events]
    assert [data["sequence_number"] for _, data in events] == list(range(len(events))), (
        "sequence_number is not 0, 1, 2, ..."
    )
    assert types[0] == "response.created", f"first event is {types[0]}"
    assert types[1] == "response.in_progress", f"second event is {types[1]}"
    assert types[-1] in ("response.completed", "response.incomplete"), f"last event is {types[-1]}"
    added: dict[int, dict] = {}
    done: set[int] = set()
    parts: dict[int, str] = {}
    #: the closing events an open item still owes before its output_item.done, in order
    owed: list[str] = []
    open_index = None
    for _, data in events[2:-1]:
        kind = data["type"]
        if kind == "response.output_item.added":
            index = data["output_index"]
            assert open_index is None, f"item {index} added while {open_index} is open"
            assert index == len(added), f"output_index {index} out of order or repeated"
            added[index] = data["item"]
            open_index = index
            owed = {
                "message": ["response.output_text.done", "response.content_part.done"],
                "reasoning": ["response.reasoning_text.done", "response.content_part.done"],
                "function_call": ["response.function_call_arguments.done"],
            }[data["item"]["type"]]
            continue
        index = data["output_index"]
        assert index == open_index, f"{kind} for output_index {index}, open is {open_index}"
        item = added[index]
        if kind.endswith(".done") and kind != "response.output_item.done":
            assert owed and owed[0] == kind, f"{kind} out of order (expected {owed[:1]})"
            owed.pop(0)
        elif kind != "response.output_item.done":
            assert len(owed) == {"function_call": 1}.get(item["type"], 2), (
                f"{kind} after the item's closing events began"
            )
        if kind == "response.content_part.added":
            assert item["type"] in ("message", "reasoning") and index not in parts
            parts[index] = ""
        elif kind in ("response.output_text.delta", "response.reasoning_text.delta"):
            want = "message" if kind == "response.output_text.delta" else "reasoning"
            assert item["type"] == want, f"{kind} in a {item['type']} item"
            assert index in parts, f"{kind} before response.content_part.added"
            parts[index] += data["delta"]
        elif kind in ("response.output_text.done", "response.reasoning_text.done"):
            assert data["text"] == parts[index], "text .done differs from the deltas"
        elif kind == "response.content_part.done":
            assert data["part"]["text"] == parts[index]
        elif kind == "response.function_call_arguments.delta":
            assert item["type"] == "function_call"
            parts[index] = parts.get(index, "") + data["delta"]
        elif kind == "response.function_call_arguments.done":
            assert data["arguments"] == parts.get(index, ""), "arguments .done differs"
        elif kind == "response.output_item.done":
            assert not owed, f"output_item.done before {owed}"
            assert data["item"]["id"] == item["id"], "output_item.done for another item"
            if item["type"] in ("message", "reasoning"):
                assert index in parts, "a text item closed without its content part"
            done.add(index)
            open_index = None
        else:
            raise AssertionError(f"unexpected event {kind}")
    assert set(added) == done, f"items {sorted(set(added) - done)} never done"
    final = events[-1][1]["response"]
    assert [i["id"] for i in final["output"]] == [added[i]["id"] for i in sorted(added)]
    return final
