"""The ``mistral`` tool-call format: ``[TOOL_CALLS]`` in both of Mistral's forms.

Owner: registered by ``metrale_core.plugin.builtins`` as tool-call parser ``mistral`` (picked for
templates that write ``[TOOL_CALLS]`` and for model types ``mistral`` / ``mistral3``); one
:class:`MistralToolParser` per sequence.  (It was the contrib plugin ``metrale-mistral-tools``;
the core serves Mistral-Nemo, so the parser lives here and the plugin is gone.)

Formats::

    [TOOL_CALLS][{"name": "f", "arguments": {...}, "id": "abc123XYZ"}, ...]     v3 (Mistral-Nemo, 7B v0.3)
    [TOOL_CALLS]f[ARGS]{...}[TOOL_CALLS]g[ARGS]{...}                          v11+ (Small 3.x, Devstral)
    [TOOL_CALLS]f[CALL_ID]abc123XYZ[ARGS]{...}                                Small 3.2's variant

After ``[TOOL_CALLS]`` (and optional whitespace) a ``[`` or ``{`` starts the v3 form, read by
:class:`~metrale_core.streamparse.jsoncalls.JsonCallsParser`; anything else is a name.  States of
the named form: ``name`` (up to ``[ARGS]``; a ``[CALL_ID]`` part is dropped) -> ``args`` (one JSON
object, its end found by :class:`ObjectScanner`) -> ``out``; a malformed call goes to the base's
``skip`` state, which runs to the next ``[TOOL_CALLS]`` (there is no closing tag).

Tool-call ids are 9 alphanumeric characters (:meth:`MistralToolParser.new_call_id`): Mistral's
templates refuse any other id when the call is sent back in the next turn.

Invariants:
- Those of ``TagParserBase``: any split of the same text over ``feed`` calls gives the same
  result; text that may be the start of a tag is held back until the next feed decides it.
- A call's header (index, name) is sent when ``[ARGS]`` follows a valid name; its arguments are
  sent in one piece when the object closes and ``json.loads`` gives a dict.  Anything else (a bad
  name, no ``[ARGS]``, invalid JSON, the stream ending inside the call) returns the call's whole
  raw text as content; a header already sent keeps its index used.
- The B1 state describes consumed text only: ``inside_parameter_body`` while the scanner is inside
  a value of the arguments object, ``param_body_chars_emitted`` counting that value's characters.
"""

from __future__ import annotations

import json
import secrets
import string

from loguru import logger

from metrale_core.streamparse.base import held_back_len
from metrale_core.streamparse.jsoncalls import NAME, JsonCallsParser, ObjectScanner

__all__ = ["ARGS", "CALL_ID", "TOOL_CALLS", "MistralToolParser"]

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
_ID_CHARS = string.ascii_letters + string.digits
_WS = " \t\r\n"


def _call_id_ok(text: str) -> bool:
    """Whether ``text`` is empty, a start of ``[CALL_ID]``, or ``[CALL_ID]`` and a short id."""
    if not text or CALL_ID.startswith(text):
        return True
    return text.startswith(CALL_ID) and len(text) <= len(CALL_ID) + 64 and "[" not in text[len(CALL_ID) :]


class MistralToolParser(JsonCallsParser):
    """See the module docstring."""

    call_open = TOOL_CALLS
    call_close = None

    def __init__(self, tools: list[dict] | None = None) -> None:
        super().__init__(tools)
        #: The request's tool names (for logging unknown names; calls are not filtered).
        self.tool_names = set(self.tool_schemas)

    @staticmethod
    def new_call_id() -> str:
        """A tool-call id Mistral's templates accept: 9 letters and digits."""
        return "".join(secrets.choice(_ID_CHARS) for _ in range(9))

    # --- TagParserBase -------------------------------------------------------------------------
    def _first_call_state(self) -> str:
        return "start"

    def _reset_call(self) -> None:
        super()._reset_call()
        self._name_text = ""

    # --- states ------------------------------------------------------------------------------
    def _st_start(self, final: bool) -> bool:
        if not self._skip_ws():
            return False
        self._state = "json" if self._buf[self._pos] in "[{" else "name"
        return True

    def _st_name(self, final: bool) -> bool:
        buf, pos = self._buf, self._pos
        i = buf.find(ARGS, pos)
        keep = 0 if i >= 0 or final else held_back_len(buf, ARGS, pos)
        text = buf[pos:i] if i >= 0 else buf[pos : len(buf) - keep]
        full = self._name_text + text
        name = full.split("[", 1)[0].strip()
        call_id = full[len(full.split("[", 1)[0]) :]  # "" or "[CALL_ID]..." (or a part of it)
        if (name and not NAME.fullmatch(name)) or not _call_id_ok(call_id):
            self._malformed(f"{full[:40]!r} is not a tool name")
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
        self._json_start = sum(map(len, self._raw))
        self._state = "args"
        return True

    def _st_args(self, final: bool) -> bool:
        return self._scan_value("the arguments are not a JSON object", self._close_call)

    def _close_call(self, text: str) -> bool:
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
