"""Output items of a response, built piece by piece, with the stream events of each step.

Owner: ``server.responses.route`` feeds every :class:`~metrale_core.server.translate.Piece` to
one :class:`OutputBuilder`; a streamed response sends the events it returns, a whole one only
keeps the finished items.  So both modes produce the same items.

Event order (what the ``openai`` client's ``responses.stream()`` helper checks):
- a ``message`` item: ``response.output_item.added`` -> ``response.content_part.added`` ->
  ``response.output_text.delta``... -> ``response.output_text.done`` ->
  ``response.content_part.done`` -> ``response.output_item.done``;
- a ``reasoning`` item: the same with ``reasoning_text`` parts and
  ``response.reasoning_text.delta`` / ``.done``;
- a ``function_call`` item: ``response.output_item.added`` (empty ``arguments``) ->
  ``response.function_call_arguments.delta``... -> ``response.function_call_arguments.done`` ->
  ``response.output_item.done``.

Invariants:
- At most one item is open; a piece of another kind (or a new call) closes it first, so items
  never interleave and every ``output_index`` is used once, in order.
- Every added item is done before :meth:`OutputBuilder.finish` returns; the route then sends
  ``response.completed`` / ``response.incomplete``.
- Tool-call arguments travel only in ``function_call`` items, never as output text.
"""

from __future__ import annotations

import uuid
from typing import Any

from attrs import define, field

from metrale_core.server.translate import Piece

__all__ = ["OutputBuilder"]


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@define
class OutputBuilder:
    """See the module docstring."""

    items: list[dict] = field(factory=list)
    #: The open item (the last of ``items``) and its kind, or None.
    _open: str | None = None
    _call_index: int | None = None

    def feed(self, piece: Piece) -> list[dict]:
        """The events of one piece."""
        events: list[dict] = []
        if piece.kind in ("text", "reasoning"):
            kind = "message" if piece.kind == "text" else "reasoning"
            if self._open != kind:
                events += self._close()
                events += self._open_item(kind)
            item, index = self.items[-1], len(self.items) - 1
            part = item["content"][0]
            part["text"] += piece.text
            events.append(
                {
                    "type": "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta",
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "delta": piece.text,
                    **({"logprobs": []} if kind == "message" else {}),
                }
            )
        elif piece.kind == "call":
            events += self._close()
            self._call_index = piece.index
            events += self._open_item("function_call", call_id=piece.call_id, name=piece.name)
        elif piece.kind == "args" and self._open == "function_call" and piece.index == self._call_index:
            item = self.items[-1]
            item["arguments"] += piece.text
            events.append(
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item["id"],
                    "output_index": len(self.items) - 1,
                    "delta": piece.text,
                }
            )
        return events

    def finish(self) -> list[dict]:
        """Close the open item; returns its closing events."""
        return self._close()

    # --- internals ---------------------------------------------------------------------------
    def _open_item(self, kind: str, **extra: Any) -> list[dict]:
        if kind == "function_call":
            item = {
                "type": "function_call",
                "id": _id("fc"),
                "call_id": extra["call_id"],
                "name": extra["name"],
                "arguments": "",
                "status": "in_progress",
            }
        elif kind == "message":
            item = {"type": "message", "id": _id("msg"), "role": "assistant", "status": "in_progress", "content": []}
        else:
            item = {"type": "reasoning", "id": _id("rs"), "summary": [], "content": [], "status": "in_progress"}
        self.items.append(item)
        self._open = kind
        index = len(self.items) - 1
        events = [{"type": "response.output_item.added", "output_index": index, "item": _copy(item)}]
        if kind != "function_call":
            part = (
                {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                if kind == "message"
                else {"type": "reasoning_text", "text": ""}
            )
            item["content"].append(part)
            events.append(
                {
                    "type": "response.content_part.added",
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "part": dict(part),
                }
            )
        return events

    def _close(self) -> list[dict]:
        kind, self._open = self._open, None
        if kind is None:
            return []
        item, index = self.items[-1], len(self.items) - 1
        item["status"] = "completed"
        events: list[dict] = []
        if kind == "function_call":
            events.append(
                {
                    "type": "response.function_call_arguments.done",
                    "item_id": item["id"],
                    "output_index": index,
                    "name": item["name"],
                    "arguments": item["arguments"],
                }
            )
        else:
            part = item["content"][0]
            done = "response.output_text.done" if kind == "message" else "response.reasoning_text.done"
            events.append(
                {
                    "type": done,
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "text": part["text"],
                    **({"logprobs": []} if kind == "message" else {}),
                }
            )
            events.append(
                {
                    "type": "response.content_part.done",
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "part": dict(part),
                }
            )
        events.append({"type": "response.output_item.done", "output_index": index, "item": _copy(item)})
        return events


def _copy(item: dict) -> dict:
    out = dict(item)
    if "content" in out:
        out["content"] = [dict(p) for p in out["content"]]
    return out
