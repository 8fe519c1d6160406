"""gpt-oss's harmony format: channels for reasoning, tool calls and the answer, in one parser.

Owner: :func:`metrale_core.streamparse.parser.make_stream_parser` builds one
:class:`HarmonyParser` per sequence when the reasoning format or the tool-call parser is
``harmony`` (picked for templates that write ``<|channel|>`` ... ``<|message|>`` and for model type
``gpt_oss``).  It takes the place of both the ``<think>`` splitter and the tool-call parser,
because in harmony the channel of each message says what its text is.

Format (the model continues a prompt that ends with ``<|start|>assistant``)::

    <|channel|>analysis<|message|>Need the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "X"}<|call|>
    <|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>

A message is a *header* (an optional ``<|start|>`` and role, ``<|channel|>NAME``, an optional
``to=RECIPIENT`` before or after the channel, an optional content type or ``<|constrain|>json``),
``<|message|>``, a body, and an end: ``<|end|>`` (another message follows), or ``<|call|>`` /
``<|return|>`` (the turn is over: text after them is dropped, and normally the engine stops there
because they are end-of-generation tokens).  ``<|start|>`` without an ``<|end|>`` also ends a body.
What a body is:
- ``to=functions.NAME`` (any channel), with tool parsing on: a tool call, sent (header and
  arguments together) when the body ends and ``json.loads`` gives an object (the stream may end
  there, as when ``<|call|>`` is the end-of-generation token).  Fail-closed: a body that is not a
  JSON object never shows up as a call, not even as a name;
- another recipient, or ``to=functions.NAME`` with tool parsing off (``tool_choice: none``): the
  raw message text, header included, as content;
- channel ``analysis``: reasoning;
- ``final``, ``commentary`` without a recipient (a preamble shown to the user), or no channel:
  content.

Invariants:
- Those of ``TagParserBase``: any split of the same text over ``feed`` calls gives the same
  content, reasoning and calls (a partial marker is held back; a header is read whole).  A
  malformed call (arguments that are not a JSON object) comes back whole, header included, as
  content, and uses no call index.  Nothing raises on model output.
- Text that is not harmony at all (no ``<|message|>`` within :data:`MAX_HEADER` characters, or
  by the end of the stream) is content, unchanged.
- ``in_reasoning`` is True while the committed text is inside an ``analysis`` body.
- The markers are special tokens in gpt-oss's tokenizer: the parser asks the engine to keep
  special tokens in the text it is fed (``keeps_special_tokens``).
"""

from __future__ import annotations

import json
import re

from loguru import logger

from metrale_core.streamparse.base import ParsedDelta, TagParserBase, scan_tags
from metrale_core.streamparse.jsoncalls import NAME

__all__ = ["CALL", "CHANNEL", "END", "MAX_HEADER", "MESSAGE", "RETURN", "START", "HarmonyParser"]

START = "<|start|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
END = "<|end|>"
CALL = "<|call|>"
RETURN = "<|return|>"
#: The longest header read before the text is taken for plain (non-harmony) content.
MAX_HEADER = 256
_BODY_ENDS = (END, CALL, RETURN, START)
_CHANNEL_RE = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_]+)")
_RECIPIENT_RE = re.compile(r"to=([^\s<]+)")
_FUNCTIONS = "functions."


class HarmonyParser(TagParserBase):
    """See the module docstring.  ``parse_calls=False``: calls are content (no tools asked)."""

    call_open = START
    call_close = None
    keeps_special_tokens = True

    def __init__(self, tools: list[dict] | None = None, parse_calls: bool = True) -> None:
        super().__init__(tools)
        self.parse_calls = parse_calls
        self.in_reasoning = False
        self._state = "header"
        self._kind = "content"
        self._body: list[str] = []
        self._dropped = False

    # --- TagParserBase -------------------------------------------------------------------------
    def _complete_at_eos(self) -> bool:
        """The stream ended in a call's body (``<|call|>`` was the end-of-generation token)."""
        return self._state == "body" and self._send_call_args()

    # --- states ------------------------------------------------------------------------------
    def _st_header(self, final: bool) -> bool:
        """A header stays in the buffer (at most MAX_HEADER characters) until ``<|message|>``."""
        i = self._buf.find(MESSAGE, self._pos, self._pos + MAX_HEADER + len(MESSAGE))
        if i < 0:
            if final or len(self._buf) - self._pos > MAX_HEADER:
                self._state = "plain"
                return True
            return False
        header = self._consume(i)
        self._consume(i + len(MESSAGE))
        self._open_message(header)
        return True

    def _st_body(self, final: bool) -> bool:
        i, tag = scan_tags(self._buf, self._pos, _BODY_ENDS, final)
        piece = self._consume(i)
        if self._kind == "call":
            self._body.append(piece)
        elif self._kind == "reasoning":
            self._emit(reasoning=piece)
        else:
            self._emit(content=piece)
        if tag is None:
            return False
        if tag != START:  # <|start|> begins the next header: it stays for it
            self._consume(i + len(tag))
        self._end_message()
        if tag in (CALL, RETURN):
            self._state = "after"
        return True

    def _st_plain(self, final: bool) -> bool:
        self._emit(content=self._consume(len(self._buf)))
        return False

    def _st_after(self, final: bool) -> bool:
        dropped = self._consume(len(self._buf))
        if dropped.strip() and not self._dropped:
            self._dropped = True
            logger.info("harmony: dropping the text after the end of the turn ({!r}...)", dropped[:40])
        return False

    # --- messages ----------------------------------------------------------------------------
    def _open_message(self, header: str) -> None:
        channel = _CHANNEL_RE.search(header)
        recipient = _RECIPIENT_RE.search(header)
        name = recipient.group(1)[len(_FUNCTIONS) :] if recipient else ""
        self._state, self._body = "body", []
        if recipient and self.parse_calls and recipient.group(1).startswith(_FUNCTIONS) and NAME.fullmatch(name):
            self._kind = "call"
            self._raw = [header, MESSAGE]
            self.inside_tool_call = True
            self._call_name = name
        elif recipient:
            self._kind = "raw"
            self._emit(content=header + MESSAGE)
        else:
            self._kind = "reasoning" if channel and channel.group(1) == "analysis" else "content"
        self.in_reasoning = self._kind == "reasoning"

    def _end_message(self) -> None:
        if self._kind == "call":
            if self._send_call_args():
                self._complete_call()
            else:
                self._fallback(self._why)
        self.in_reasoning = False
        self._kind = "content"
        self._state = "header"

    def _send_call_args(self) -> bool:
        text = "".join(self._body).strip()
        try:
            value = json.loads(text)
        except ValueError as exc:
            self._why = f"invalid JSON arguments ({exc})"
            return False
        if not isinstance(value, dict):
            self._why = "the arguments are not a JSON object"
            return False
        self._send_header(self._call_name)
        self._send_args(text)
        return True

    def _content(self, text: str) -> None:
        """Content exactly as written (a malformed call's text too): harmony has no whitespace
        between calls to drop."""
        self._emit(content=text)

    def _emit(self, content: str = "", reasoning: str = "") -> None:
        if content or reasoning:
            self._out.append(ParsedDelta(content=content, reasoning=reasoning))
