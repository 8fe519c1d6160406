"""``MistralToolParser``: one sequence's streaming parser of ``[TOOL_CALLS]name[ARGS]{json}``.

Owner: ``ToolCallParserSpec("mistral").factory(tools=...)`` builds one per sequence; the core's
``StreamParser`` feeds it the generated text (reasoning already split off), adds call ids and
merges the pieces.  It subclasses the core's public ``TagParserBase`` (buffer driver, content,
call bookkeeping, fallback, ``feed`` / ``finish``) and adds only the states of its format.

States: ``out`` (the base's: content; looking for ``[TOOL_CALLS]``) -> ``name`` (up to ``[ARGS]``)
-> ``args`` (one JSON object, its end found by :class:`ObjectScanner`) -> ``out``; a malformed
call goes to the base's ``skip`` state, which runs to the next ``[TOOL_CALLS]`` (there is no
closing tag).

Invariants:
- Any split of the same text over ``feed`` calls gives the same concatenated content, the same
  calls and the same arguments: text that may be the start of a tag is held back until the next
  feed decides it, and nothing else is.
- A call's header (index, name) is sent when ``[ARGS]`` follows a valid name; its arguments are
  sent in one piece when the object closes and ``json.loads`` gives a dict.  Anything else (a bad
  name, no ``[ARGS]``, invalid JSON, the stream ending inside the call) returns the call's whole
  raw text as content; a header already sent keeps its index used.
- Whitespace between calls or after the last well-formed call is dropped; inside content it is
  kept (the base's rule).
- The B1 state describes consumed text only: ``inside_parameter_body`` while the scanner is inside
  a value of the arguments object, ``param_body_chars_emitted`` counting that value's characters.
"""

from __future__ import annotations

import json
import re

from loguru import logger

from metrale_core.api import TagParserBase, held_back_len

__all__ = ["ARGS", "TOOL_CALLS", "MistralToolParser", "ObjectScanner"]

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_MAX_NAME = 128
_WS = " \t\r\n"


class ObjectScanner:
    """Finds the end of one JSON object pushed character by character.

    It follows strings, escapes and bracket depth (validation is ``json.loads``' job, at the
    end) and tracks the *body* of each value of the top-level object: a string's characters
    between its quotes, a container's between its brackets, a number's or literal's own.
    """

    def __init__(self) -> None:
        self.depth = 0
        self.started = False
        self.done = False
        self.in_string = False
        self.escape = False
        self.after_colon = False
        #: Kind of the open top-level value ("string", "container", "scalar") or None.
        self.body: str | None = None
        self.body_chars = 0

    def push(self, ch: str) -> bool:
        """Consume ``ch``; False when the text cannot be a JSON object."""
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
            self.started, self.depth = True, 1
            return ch == "{"
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
            self.after_colon = True
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


class MistralToolParser(TagParserBase):
    """See the module docstring."""

    call_open = TOOL_CALLS
    call_close = None

    def __init__(self, tools: list[dict] | None = None) -> None:
        super().__init__(tools)
        #: The request's tool names (for logging unknown names; calls are not filtered).
        self.tool_names = set(self.tool_schemas)

    # --- TagParserBase -------------------------------------------------------------------------
    def _first_call_state(self) -> str:
        return "name"

    def _complete_at_eos(self) -> bool:
        return False  # a call ends with its JSON object; one the stream cut short is malformed

    def _reset_call(self) -> None:
        super()._reset_call()
        self._name_text = ""
        self._scanner: ObjectScanner | None = None

    # --- states ------------------------------------------------------------------------------
    def _st_name(self, final: bool) -> bool:
        buf, pos = self._buf, self._pos
        i = buf.find(ARGS, pos)
        keep = 0 if i >= 0 or final else held_back_len(buf, ARGS, pos)
        text = buf[pos:i] if i >= 0 else buf[pos : len(buf) - keep]
        name = (self._name_text + text).strip()
        if name and (len(name) > _MAX_NAME or not _NAME.fullmatch(name)):
            self._malformed(f"{name[:40]!r} is not a tool name")
            return True
        if i < 0:
            self._consume(pos + len(text))
            self._name_text += text
            return False
        if not name:
            self._malformed("the call has no name before [ARGS]")
            return True
        self._consume(i + len(ARGS))
        if self.tool_names and name not in self.tool_names:
            logger.debug("mistral tool call names {!r}, which the request did not offer", name)
        self._send_header(name)
        self._scanner = ObjectScanner()
        self._state = "args"
        return True

    def _st_args(self, final: bool) -> bool:
        scanner, buf, pos = self._scanner, self._buf, self._pos
        assert scanner is not None  # set with the header, before the "args" state
        for i in range(pos, len(buf)):
            ok = scanner.push(buf[i])
            self.inside_parameter_body = scanner.body is not None
            self.param_body_chars_emitted = scanner.body_chars if self.inside_parameter_body else 0
            if not ok:
                self._consume(i)
                self._malformed("the arguments are not a JSON object")
                return True
            if scanner.done:
                self._consume(i + 1)
                return self._close_call()
        self._consume(len(buf))
        return False

    def _close_call(self) -> bool:
        text = "".join(self._raw).split(ARGS, 1)[1].strip()
        try:
            value = json.loads(text)
        except ValueError as exc:
            self._fallback(f"invalid JSON arguments ({exc})")
            return True
        if not isinstance(value, dict):
            self._fallback("the arguments are not a JSON object")
            return True
        self._send_args(text)
        self._complete_call()
        return True
