"""Tool calls written as JSON after a marker: one call object, or a list of them.

Owner: registered by ``metrale_core.plugin.builtins`` as tool-call parsers ``granite`` and ``phi4_mini``;
:class:`JsonCallsParser` is also the base of the ``mistral`` parser (its older form).

Formats::

    <|tool_call|>[{"name": "f", "arguments": {...}}, ...]                  granite (3.x)
    <|tool_call|>[{"name": "f", "arguments": {...}}]<|/tool_call|>         phi4_mini
    [TOOL_CALLS] [{"name": "f", "arguments": {...}, "id": "abc123XYZ"}]    mistral v3 (see ``mistral``)

After the open marker comes one JSON value, an object or a list of objects, found by
:class:`ObjectScanner` (strings, escapes, bracket depth) and decoded with ``json.loads`` once it
closes.  A call object holds ``name`` and ``arguments`` (or ``parameters``; an object, or a JSON
string holding one; missing: ``{}``); ``id`` and ``type`` are ignored, and OpenAI's nested
``{"type": "function", "function": {...}}`` is accepted.  The calls are sent when the value
closes (fail-closed: a call's arguments are never streamed before they are known to be valid),
each with its header and its arguments as compact JSON.  ``close_tag`` (phi4_mini's
``<|/tool_call|>``) may follow the value or be missing.

The markers are special tokens in these models' tokenizers, so the parser asks the engine to keep
special tokens in the text it is fed (``keeps_special_tokens``).

Invariants: those of ``TagParserBase`` (any chunking gives the same result; a malformed call, a
value that does not decode or a call without a valid name, comes back whole as content).
"""

from __future__ import annotations

import json
import re
from typing import Any

from metrale_core.streamparse.base import TagParserBase

__all__ = ["JsonCallsParser", "ObjectScanner", "decode_calls"]

#: A tool name: what OpenAI allows, plus dots (namespaced tools).
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,127}")
_WS = " \t\r\n"
_CALL_KEYS = frozenset({"name", "arguments", "parameters", "id", "type"})


class ObjectScanner:
    """Finds the end of one JSON object (or, with ``arrays``, array) pushed character by character.

    It follows strings, escapes and bracket depth (validation is ``json.loads``' job, at the
    end) and tracks the *body* of each value of a top-level object: a string's characters
    between its quotes, a container's between its brackets, a number's or literal's own.
    """

    def __init__(self, arrays: bool = False) -> None:
        self.arrays = arrays
        self.depth = 0
        self.started = False
        self.done = False
        self.in_string = False
        self.escape = False
        self.after_colon = False
        self.is_object = False
        #: Kind of the open top-level value ("string", "container", "scalar") or None.
        self.body: str | None = None
        self.body_chars = 0

    def push(self, ch: str) -> bool:
        """Consume ``ch``; False when the text cannot be the expected JSON value."""
        if self.in_string:
            if self.escape:
                self.escape = False
            elif ch == "\\":
                self.escape = True
            elif ch == '"':
                self.in_string = False
                if self.body == "string" and self.depth == 1:
                    self.body = None
                    return True
            self._count()
            return True
        if not self.started:
            if ch in _WS:
                return True
            self.started, self.depth, self.is_object = True, 1, ch == "{"
            return ch == "{" or (self.arrays and ch == "[")
        if self.body == "scalar" and (ch in ",}" or ch in _WS):
            self.body = None
        if ch == '"':
            self.in_string = True
            if self._value_starts():
                self.body, self.body_chars = "string", 0
            else:
                self._count()
        elif ch in "{[":
            if self._value_starts():
                self.body, self.body_chars = "container", 0
            else:
                self._count()
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1
            if self.depth == 0:
                self.done = True
            elif self.depth == 1 and self.body == "container":
                self.body = None
            else:
                self._count()
        elif ch == ":" and self.depth == 1:
            self.after_colon = self.is_object
        elif ch in _WS or (ch == "," and self.depth == 1):
            self._count()
        elif self._value_starts():
            self.body, self.body_chars = "scalar", 1
        else:
            self._count()
        return True

    def _value_starts(self) -> bool:
        if self.depth == 1 and self.after_colon:
            self.after_colon = False
            return True
        return False

    def _count(self) -> None:
        if self.body is not None:
            self.body_chars += 1


def _arguments(item: dict[str, Any]) -> dict | str:
    args = item.get("arguments", item.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return "the arguments string is not JSON"
    return args if isinstance(args, dict) else "the arguments are not a JSON object"


def decode_calls(value: Any) -> list[tuple[str, str]] | str:
    """``[(name, arguments JSON)]`` of a decoded call object or list, or why it is not one."""
    items = value if isinstance(value, list) else [value]
    if not items:
        return "an empty list of tool calls"
    calls = []
    for item in items:
        if not isinstance(item, dict):
            return "a tool call is not a JSON object"
        if "name" not in item and isinstance(item.get("function"), dict):
            item = item["function"]  # OpenAI's {"type": "function", "function": {...}}
        extra = sorted(set(item) - _CALL_KEYS)
        if extra:
            return f"unexpected key {extra[0]!r} in a tool call"
        name = item.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name.strip()):
            return f"{str(name)[:40]!r} is not a tool name"
        args = _arguments(item)
        if isinstance(args, str):
            return args
        calls.append((name.strip(), json.dumps(args, ensure_ascii=False)))
    return calls


class JsonCallsParser(TagParserBase):
    """See the module docstring; subclasses set ``call_open`` and ``close_tag``."""

    call_open = "<|tool_call|>"
    call_close: str | None = None
    #: A tag that may follow the JSON value (dropped); None: the format has none.
    close_tag: str | None = None
    #: The markers are special tokens: the engine must keep them in the decoded text.
    keeps_special_tokens = True

    def _first_call_state(self) -> str:
        return "json"

    def _complete_at_eos(self) -> bool:
        return False  # calls are sent when their JSON closes; a cut-short value is malformed

    def _reset_call(self) -> None:
        super()._reset_call()
        self._scanner: ObjectScanner | None = None

    def _st_json(self, final: bool) -> bool:
        if self._scanner is None:
            self._scanner = ObjectScanner(arrays=True)
            self._json_start = sum(map(len, self._raw))
        return self._scan_value("the text after the tool-call marker is not a JSON object or list", self._send_calls)

    def _scan_value(self, why: str, done) -> bool:
        """Push the buffer through the scanner; ``done(json_text)`` when the value closed."""
        scanner, buf, pos = self._scanner, self._buf, self._pos
        assert scanner is not None
        for i in range(pos, len(buf)):
            ok = scanner.push(buf[i])
            self.inside_parameter_body = scanner.body is not None
            self.param_body_chars_emitted = scanner.body_chars if self.inside_parameter_body else 0
            if not ok:
                self._consume(i)
                self._malformed(why)
                return True
            if scanner.done:
                self._consume(i + 1)
                self._close_body()
                return done("".join(self._raw)[self._json_start :].strip())
        self._consume(len(buf))
        return False

    def _send_calls(self, text: str) -> bool:
        try:
            calls = decode_calls(json.loads(text))
        except ValueError as exc:
            calls = f"invalid JSON ({exc})"
        if isinstance(calls, str):
            self._fallback(calls)
            return True
        for name, args in calls:
            self._send_header(name)
            self._send_args(args)
            self._complete_call()
        if self.close_tag is not None:
            self._state = "close"
        return True

    def _st_close(self, final: bool) -> bool:
        """After the calls: drop an optional ``close_tag`` (and the whitespace before it)."""
        assert self.close_tag is not None
        buf, i = self._buf, self._pos
        while i < len(buf) and buf[i] in _WS:
            i += 1
        rest = buf[i : i + len(self.close_tag)]
        if rest == self.close_tag:
            self._pos = i + len(self.close_tag)
        elif not final and self.close_tag.startswith(rest):
            return False  # a partial tag, or only whitespace so far
        self._state = "out"
        return True


class GraniteParser(JsonCallsParser):
    """Granite 3.x: ``<|tool_call|>`` and a JSON list, no closing tag."""


class Phi4MiniParser(JsonCallsParser):
    """Phi-4-mini: ``<|tool_call|>`` JSON ``<|/tool_call|>`` (the closing tag may be missing)."""

    close_tag = "<|/tool_call|>"
    call_close = "<|/tool_call|>"  # a malformed call is skipped up to it
