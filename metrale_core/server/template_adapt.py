"""What some chat templates ask of the conversation beyond transformers' variables.

Owner: ``chat_prompt.render_messages`` calls :func:`adapt_messages` on the template-ready messages
before rendering, with the served template's text.

- Phi-4-mini's template renders tools only from the *system message's* ``tools`` field (a JSON
  string, inside ``<|tool|>...<|/tool|>``), never from the ``tools`` variable: the request's tools
  are put there as a JSON list of the function objects (the layout of the model card), into the
  first system message or a new empty one in front.
- Mistral's templates refuse a tool-call id that is not 9 characters (``raise_exception`` on
  ``tool_call.id|length != 9``): ids of another shape (OpenAI's ``call_...``) are mapped to 9
  alphanumeric characters, the same for the assistant's call and the tool message that answers it.
  The ids Metrale itself hands out for these templates already have that shape.

Invariants: pure functions of (template, messages, tools); the input messages are not mutated; a
template that asks for none of this gets the messages unchanged.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from metrale_core.streamparse.template_format import tools_in_system_message

__all__ = ["adapt_messages", "nine_char_id"]

_NINE = re.compile(r"[A-Za-z0-9]{9}")
_MISTRAL_ID_CHECK = re.compile(r"\.id\|length != 9|tool_call_id\|length != 9")


def nine_char_id(call_id: str) -> str:
    """``call_id`` if it is 9 letters/digits, else a stable 9-character stand-in for it."""
    if _NINE.fullmatch(call_id):
        return call_id
    return hashlib.sha256(call_id.encode("utf-8")).hexdigest()[:9]


def _with_system_tools(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    listing = json.dumps([t.get("function", t) for t in tools], ensure_ascii=False)
    if messages and messages[0].get("role") == "system":
        return [{**messages[0], "tools": listing}, *messages[1:]]
    return [{"role": "system", "content": "", "tools": listing}, *messages]


def _nine_char_ids(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [{**c, "id": nine_char_id(c["id"])} if c.get("id") else c for c in m["tool_calls"]]
            m = {**m, "tool_calls": calls}
        if m.get("tool_call_id"):
            m = {**m, "tool_call_id": nine_char_id(m["tool_call_id"])}
        out.append(m)
    return out


def adapt_messages(
    template: str | None, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """``messages`` as ``template`` needs them (see the module docstring)."""
    if not template:
        return messages
    if tools and tools_in_system_message(template):
        messages = _with_system_tools(messages, tools)
    if _MISTRAL_ID_CHECK.search(template):
        messages = _nine_char_ids(messages)
    return messages
