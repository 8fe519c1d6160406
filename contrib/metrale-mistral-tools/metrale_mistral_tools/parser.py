"""``MistralToolParser``: one sequence's streaming parser of ``[TOOL_CALLS]name[ARGS]{json}``.

Owner: ``ToolCallParserSpec("mistral").factory(tools=...)`` builds one per sequence; the core's
``StreamParser`` feeds it the generated text (reasoning already split off), adds call ids and
merges the pieces.  It satisfies ``metrale_core.streamparse.ToolCallParser``.

States: ``out`` (content; looking for ``[TOOL_CALLS]``) -> ``name`` (up to ``[ARGS]``) -> ``args``
(one JSON object, its end found by :class:`ObjectScanner`) -> ``out``.

Invariants:
- Any split of the same text over ``feed`` calls gives the same concatenated content, the same
  calls and the same arguments: text that may be the start of a tag is held back until the next
  feed decides it, and nothing else is.
- A call's header (index, name) is sent when ``[ARGS]`` follows a valid name; its arguments are
  sent in one piece when the object closes and ``json.loads`` gives a dict.  Anything else (a bad
  name, no ``[ARGS]``, invalid JSON, the stream ending inside the call) returns the call's whole
  raw text as content; a header already sent keeps its index used.
- Whitespace between calls or after the last call is dropped; inside content it is kept.
- The B1 state describes consumed text only: ``inside_parameter_body`` while the scanner is inside
  a value of the arguments object, ``param_body_chars_emitted`` counting that value's characters.
"""

from __future__ import annotations

import json
import re

from loguru import logger

from metrale_core.streamparse import CompletedCall, ParsedDelta, held_back_len

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


class MistralToolParser:
    """See the module docstring."""

    def __init__(self, tools: list[dict] | None = None) -> None:
        #: The request's tool names (for logging unknown names; calls are not filtered).
        self.tool_names = {((t.get("function") or t).get("name")) for t in tools or []}
        self.completed_calls: list[CompletedCall] = []
        self._buf = ""
        self._state = "out"
        self._out: list[ParsedDelta] = []
        self._pending_ws = ""
        self._saw_call = False
        self._finished = False
        self._next_index = 0
        self._start_call()
        self.inside_tool_call = False

    # --- B1 state ----------------------------------------------------------------------------
    @property
    def inside_parameter_body(self) -> bool:
        return self._scanner is not None and self._scanner.body is not None

    @property
    def param_body_chars_emitted(self) -> int:
        return self._scanner.body_chars if self.inside_parameter_body else 0

    # --- ToolCallParser ----------------------------------------------------------------------
    def feed(self, text: str) -> list[ParsedDelta]:
        self._buf += text
        self._drive(final=False)
        return self._take()

    def finish(self) -> list[ParsedDelta]:
        if self._finished:
            return []
        self._finished = True
        self._drive(final=True)
        if self.inside_tool_call:
            where = "its name" if self._state == "name" else "its arguments"
            self._fallback(f"the stream ended inside {where}")
        if self._pending_ws and not self._saw_call:
            self._out.append(ParsedDelta(content=self._pending_ws))
        self._pending_ws = ""
        return self._take()

    # --- states ------------------------------------------------------------------------------
    def _drive(self, final: bool) -> None:
        while self._buf and getattr(self, "_st_" + self._state)(final):
            pass

    def _st_out(self, final: bool) -> bool:
        i = self._buf.find(TOOL_CALLS)
        if i < 0:
            end = len(self._buf) - (0 if final else held_back_len(self._buf, TOOL_CALLS))
            self._content(self._buf[:end])
            self._buf = self._buf[end:]
            return False
        self._content(self._buf[:i])
        self._buf = self._buf[i + len(TOOL_CALLS):]
        self._start_call()
        self.inside_tool_call = self._saw_call = True
        self._raw = [self._pending_ws, TOOL_CALLS]
        self._pending_ws = ""
        self._state = "name"
        return True

    def _st_name(self, final: bool) -> bool:
        i = self._buf.find(ARGS)
        keep = 0 if i >= 0 or final else held_back_len(self._buf, ARGS)
        text = self._buf[:i] if i >= 0 else self._buf[:len(self._buf) - keep]
        name = (self._name_text + text).strip()
        if name and (len(name) > _MAX_NAME or not _NAME.fullmatch(name)):
            return self._malformed(f"{name[:40]!r} is not a tool name")
        if i < 0:
            self._take_raw(len(text))
            self._name_text += text
            return False
        if not name:
            return self._malformed("the call has no name before [ARGS]")
        self._take_raw(i + len(ARGS))
        self._index, self._name = self._next_index, name
        self._next_index += 1
        if self.tool_names and name not in self.tool_names:
            logger.debug("mistral tool call names {!r}, which the request did not offer", name)
        self._out.append(ParsedDelta(tool_call_index=self._index, name=name))
        self._scanner = ObjectScanner()
        self._state = "args"
        return True

    def _st_args(self, final: bool) -> bool:
        scanner, buf = self._scanner, self._buf
        for i, ch in enumerate(buf):
            if not scanner.push(ch):
                self._take_raw(i)
                return self._malformed("the arguments are not a JSON object")
            if scanner.done:
                self._take_raw(i + 1)
                return self._close_call()
        self._take_raw(len(buf))
        return False

    # --- calls -------------------------------------------------------------------------------
    def _start_call(self) -> None:
        self._raw: list[str] = []
        self._name_text = ""
        self._index: int | None = None
        self._name: str | None = None
        self._scanner: ObjectScanner | None = None

    def _take_raw(self, end: int) -> str:
        piece, self._buf = self._buf[:end], self._buf[end:]
        self._raw.append(piece)
        return piece

    def _close_call(self) -> bool:
        text = "".join(self._raw).split(ARGS, 1)[1].strip()
        try:
            value = json.loads(text)
        except ValueError as exc:
            return self._malformed(f"invalid JSON arguments ({exc})", consumed=True)
        if not isinstance(value, dict):
            return self._malformed("the arguments are not a JSON object", consumed=True)
        self._out.append(ParsedDelta(tool_call_index=self._index, arguments=text))
        self.completed_calls.append(CompletedCall(self._index, self._name, text))
        self._end_call()
        return True

    def _end_call(self) -> None:
        self._start_call()
        self.inside_tool_call = False
        self._state = "out"

    def _malformed(self, why: str, consumed: bool = False) -> bool:
        """Return the call's raw text as content; continue after it, at the next tag or end."""
        if not consumed:  # the rest of this call runs to the next [TOOL_CALLS]
            i = self._buf.find(TOOL_CALLS)
            if i < 0 and not self._finished:
                i = len(self._buf) - held_back_len(self._buf, TOOL_CALLS)
            self._take_raw(len(self._buf) if i < 0 else i)
        self._fallback(why)
        return True

    def _fallback(self, why: str) -> None:
        raw = "".join(self._raw)
        logger.info("mistral tool call {} not parsed ({}); returned as content",
                    "" if self._index is None else f"#{self._index}", why)
        self._end_call()
        self._content(raw)

    # --- content -----------------------------------------------------------------------------
    def _content(self, text: str) -> None:
        if not text:
            return
        core = text.rstrip(_WS)
        if not core:
            self._pending_ws += text
            return
        self._out.append(ParsedDelta(content=self._pending_ws + core))
        self._pending_ws = text[len(core):]

    def _take(self) -> list[ParsedDelta]:
        out, self._out = self._out, []
        return out
