"""An incremental, validating JSON lexer that reports where values start and end.

Owner: the hermes parser (``metrale_core.streamparse.hermes``) pushes the text of a call through
one :class:`JsonLexer`, character by character (runs of plain string characters in one go).

The lexer keeps the state a streaming parser needs and nothing more: the container stack, whether
it is inside a string (and an escape), the pending number or literal.  It calls its listener:

- ``on_value_start(depth, kind)`` at the first character of a value; ``kind`` is ``"object"``,
  ``"array"``, ``"string"``, ``"number"`` or ``"literal"``; ``depth`` is the number of open
  containers around the value (the top-level value has depth 0);
- ``on_value_end(depth, raw)`` when the value is complete: after its closing ``"``, ``}`` or
  ``]``, or, for a number, when the character after it arrives; ``raw`` is the raw text between
  the quotes of a string that was captured (see ``capture_depth``), else None;
- ``on_key(depth, raw)`` when an object key is complete (raw text between its quotes).

Invariants:
- Exactly RFC 8259 (strict: no control characters inside strings); the first character that
  cannot continue valid JSON sets :attr:`JsonLexer.error` and the lexer stops.
- Each character is handled in O(1) (a string run costs one regex match).
"""

from __future__ import annotations

import re
from typing import Protocol

__all__ = ["JsonLexer", "JsonListener"]

_PLAIN_RUN = re.compile(r'[^"\\\x00-\x1f]+')
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_HEX = frozenset("0123456789abcdefABCDEF")
_ESCAPES = frozenset('"\\/bfnrt')
_LITERALS = {"t": "rue", "f": "alse", "n": "ull"}
_WS = frozenset(" \t\r\n")

# states
VALUE, ARRAY_FIRST, OBJECT_FIRST, KEY, COLON, AFTER, STRING, NUMBER, LITERAL, DONE, ERROR = range(11)


class JsonListener(Protocol):
    def on_value_start(self, depth: int, kind: str) -> None: ...

    def on_value_end(self, depth: int, raw: str | None) -> None: ...

    def on_key(self, depth: int, raw: str) -> None: ...


class JsonLexer:
    """One top-level JSON value, pushed incrementally."""

    def __init__(self, listener: JsonListener, capture_depth: int = 1) -> None:
        self.listener = listener
        #: String values at this depth are captured for ``on_value_end``.
        self.capture_depth = capture_depth
        self.stack: list[str] = []
        self.state = VALUE
        self.error: str | None = None
        self._escape = False
        self._unicode = 0
        self._is_key = False
        self._chars: list[str] | None = None
        self._number: list[str] = []
        self._literal = ""

    @property
    def done(self) -> bool:
        return self.state == DONE

    @property
    def in_string(self) -> bool:
        return self.state == STRING

    def fail(self, message: str) -> None:
        if self.error is None:
            self.error = message
        self.state = ERROR

    def string_run(self, text: str, i: int) -> int:
        """Inside a string, consume the run of plain characters at ``text[i]``; returns its end."""
        if self.state != STRING or self._escape or self._unicode:
            return i
        m = _PLAIN_RUN.match(text, i)
        if m is None:
            return i
        if self._chars is not None:
            self._chars.append(m.group())
        return m.end()

    def push(self, ch: str) -> None:
        state = self.state
        if state == STRING:
            self._string_char(ch)
            return
        if state == NUMBER:
            if ch in _NUMBER_CHARS:
                self._number.append(ch)
                return
            number = "".join(self._number)
            if not _NUMBER.fullmatch(number):
                self.fail(f"invalid number {number!r}")
                return
            self._end_value(None)
            state = self.state
        elif state == LITERAL:
            if ch != self._literal[0]:
                self.fail(f"invalid literal near {ch!r}")
                return
            self._literal = self._literal[1:]
            if not self._literal:
                self._end_value(None)
            return
        if ch in _WS or state == ERROR:
            return
        if state in (VALUE, ARRAY_FIRST):
            if state == ARRAY_FIRST and ch == "]":
                self._close()
            else:
                self._start_value(ch)
        elif state in (OBJECT_FIRST, KEY):
            if ch == '"':
                self.state, self._is_key, self._chars = STRING, True, []
            elif ch == "}" and state == OBJECT_FIRST:
                self._close()
            else:
                self.fail(f"expected an object key, got {ch!r}")
        elif state == COLON:
            if ch == ":":
                self.state = VALUE
            else:
                self.fail(f"expected ':', got {ch!r}")
        elif state == AFTER:
            top = self.stack[-1]
            if ch == ",":
                self.state = KEY if top == "o" else VALUE
            elif ch == ("}" if top == "o" else "]"):
                self._close()
            else:
                self.fail(f"expected ',' or a closing bracket, got {ch!r}")
        else:  # DONE
            self.fail(f"text after the end of the JSON value: {ch!r}")

    # --- internals ---------------------------------------------------------------------------
    def _string_char(self, ch: str) -> None:
        if self._unicode:
            if ch not in _HEX:
                self.fail(f"invalid \\u escape near {ch!r}")
                return
            self._unicode -= 1
        elif self._escape:
            if ch == "u":
                self._unicode = 4
            elif ch not in _ESCAPES:
                self.fail(f"invalid escape \\{ch}")
                return
            self._escape = False
        elif ch == "\\":
            self._escape = True
        elif ch == '"':
            raw = "".join(self._chars) if self._chars is not None else None
            self._chars = None
            if self._is_key:
                assert raw is not None  # a key's characters are always collected
                self._is_key = False
                self.state = COLON
                self.listener.on_key(len(self.stack), raw)
            else:
                self._end_value(raw)
            return
        elif ch < " ":
            self.fail(f"control character {ch!r} inside a string")
            return
        if self._chars is not None:
            self._chars.append(ch)

    def _start_value(self, ch: str) -> None:
        depth = len(self.stack)
        if ch == "{":
            kind, self.state = "object", OBJECT_FIRST
        elif ch == "[":
            kind, self.state = "array", ARRAY_FIRST
        elif ch == '"':
            kind, self.state, self._is_key = "string", STRING, False
            self._chars = [] if depth == self.capture_depth else None
        elif ch == "-" or "0" <= ch <= "9":
            kind, self.state, self._number = "number", NUMBER, [ch]
        elif ch in _LITERALS:
            kind, self.state, self._literal = "literal", LITERAL, _LITERALS[ch]
        else:
            self.fail(f"expected a JSON value, got {ch!r}")
            return
        self.listener.on_value_start(depth, kind)
        if kind in ("object", "array") and self.state != ERROR:
            self.stack.append(kind[0])

    def _close(self) -> None:
        self.stack.pop()
        self._end_value(None)

    def _end_value(self, raw: str | None) -> None:
        self.state = AFTER if self.stack else DONE
        self.listener.on_value_end(len(self.stack), raw)
