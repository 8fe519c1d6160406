"""The ``hermes`` tool-call format (Qwen2.5 / Qwen3): a JSON object between ``<tool_call>`` tags.

Owner: registered by ``metrale_core.plugin.builtins`` as tool-call parser ``hermes``; one
:class:`HermesParser` per sequence.

Format (specs §5.1)::

    <tool_call>\\n{"name": "<fn>", "arguments": {<json object>}}\\n</tool_call>

The text after ``<tool_call>`` goes through a validating :class:`JsonLexer`.  The name is sent as
soon as its string closes; the arguments stream as the model's own JSON text, so the fragments
concatenate to exactly the arguments object it wrote.  Accepted variants: ``"parameters"`` for
``"arguments"``; ``"name"`` after the arguments (they are held until the name is known);
arguments given as a JSON string holding an object (sent whole once decoded); no arguments key
(``{}``); a missing ``</tool_call>`` at the end of the stream or before the next ``<tool_call>``.
Anything else (another key, invalid JSON, text after the object) makes the call malformed.

B1 body (``inside_parameter_body``): inside one value of the arguments object, i.e. a value at
depth 1 within it, including its nested objects.  A string body opens after its opening quote
and closes at its closing quote; an object/array body opens after ``{``/``[`` and closes with
its matching bracket (delimiters are not counted); a number or literal body opens with its first
character, which counts, and closes when the character after it arrives.  Keys, ``:`` and
whitespace between values are outside.  Arguments given as a string: the whole string is one body.

Invariants: those of ``TagParserBase``; the lexer sees each character of a call once.
"""

from __future__ import annotations

import json

from metrale_core.streamparse.base import CALL_CLOSE, CALL_OPEN, TagParserBase
from metrale_core.streamparse.jsonlex import JsonLexer

__all__ = ["HermesParser"]

_ARG_KEYS = ("arguments", "parameters")


def _decode(raw: str) -> str:
    return json.loads('"' + raw + '"')


class HermesParser(TagParserBase):
    """Streaming parser of hermes-style ``<tool_call>{json}</tool_call>`` blocks."""

    def _first_call_state(self) -> str:
        return "pre"

    def _complete_at_eos(self) -> bool:
        return self._state == "post"

    # --- states ------------------------------------------------------------------------------
    def _st_pre(self, final: bool) -> bool:
        if not self._skip_ws():
            return False
        if self._buf[self._pos] != "{":
            self._malformed("expected a JSON object after <tool_call>")
            return True
        self._lexer = JsonLexer(self, capture_depth=1)
        self._key: str | None = None
        self._keys: set[str] = set()
        self._args_kind: str | None = None
        self._args_open = False
        self._state = "json"
        return True

    def _st_json(self, final: bool) -> bool:
        buf, i, n, lex = self._buf, self._pos, len(self._buf), self._lexer
        seg = i if self._streaming_args() else -1
        while i < n and not lex.done:
            j = lex.string_run(buf, i)
            if j > i:
                if self.inside_parameter_body:
                    self.param_body_chars_emitted += j - i
                i = j
                continue
            in_body, in_args = self.inside_parameter_body, self._streaming_args()
            lex.push(buf[i])
            if lex.error is not None:
                break
            if in_body and self.inside_parameter_body:
                self.param_body_chars_emitted += 1
            if not in_args and self._streaming_args():
                seg = i
            elif in_args and not self._streaming_args():
                self._send_args(buf[seg : i + 1])
                seg = -1
            i += 1
        if seg >= 0:  # up to the failing character, so the result is the same for any chunking
            self._send_args(buf[seg:i])
        self._consume(i)
        if lex.error is not None:
            self._malformed(lex.error)
        elif lex.done:
            self._state = "post"
        return lex.error is not None or lex.done

    def _st_post(self, final: bool) -> bool:
        tag = self._expect((CALL_CLOSE, CALL_OPEN), final)
        if tag == CALL_CLOSE:
            self._complete_call()
        elif tag == CALL_OPEN:  # the next call began without closing this one
            self._complete_call()
            self._open_call()
        return tag is not None

    def _streaming_args(self) -> bool:
        return self._args_open and self._args_kind == "object"

    # --- JsonListener ------------------------------------------------------------------------
    def on_key(self, depth: int, raw: str) -> None:
        if depth != 1:
            return
        key = _decode(raw)
        if key in self._keys or (key in _ARG_KEYS and self._args_kind is not None):
            self._lexer.fail(f"the tool call repeats the key {key!r}")
        self._keys.add(key)
        self._key = key

    def on_value_start(self, depth: int, kind: str) -> None:
        if depth == 0:
            if kind != "object":
                self._lexer.fail("the tool call is not a JSON object")
        elif depth == 1:
            if self._key == "name":
                if kind != "string":
                    self._lexer.fail("the tool call's name is not a string")
            elif self._key in _ARG_KEYS:
                if kind not in ("object", "string"):
                    self._lexer.fail(f"the tool call's {self._key} is not a JSON object")
                    return
                self._args_kind, self._args_open = kind, True
                if kind == "string":
                    self._open_body()
            else:
                self._lexer.fail(f"unexpected key {self._key!r} in the tool call")
        elif depth == 2 and self._streaming_args():
            self._open_body(1 if kind in ("number", "literal") else 0)

    def on_value_end(self, depth: int, raw: str | None) -> None:
        if depth == 2 and self._streaming_args():
            self._close_body()
        elif depth == 1 and self._key == "name":
            assert raw is not None  # depth-1 values are captured (capture_depth)
            name = _decode(raw)
            if not name.strip():
                self._lexer.fail("the tool call's name is empty")
            else:
                self._send_header(name)
        elif depth == 1 and self._key in _ARG_KEYS:
            self._args_open = False
            if self._args_kind == "string":
                assert raw is not None  # depth-1 values are captured (capture_depth)
                self._close_body()
                self._string_arguments(_decode(raw))
        elif depth == 0:
            if self._name is None:
                self._lexer.fail("the tool call has no name")
            elif self._args_kind is None:
                self._send_args("{}")

    def _string_arguments(self, text: str) -> None:
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            self._lexer.fail("the tool call's arguments string does not hold a JSON object")
            return
        self._send_args(text.strip())
