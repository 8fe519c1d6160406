"""The pieces every streaming tool-call parser shares.

Owner: the parsers of this package (``hermes``, ``qwen3_coder``, ``glm47``, ``jsoncalls``,
``mistral``, ``harmony``) subclass
:class:`TagParserBase`; :class:`metrale_core.streamparse.parser.StreamParser` drives one parser per
sequence.  Plugins may register any object that satisfies :class:`ToolCallParser`; a plugin
parser may subclass :class:`TagParserBase` (with its own ``call_open`` / ``call_close`` tags) and
use :func:`held_back_len` / :func:`scan_tags`, all public through ``metrale_core.api``.

How a parser runs.  ``feed(text)`` appends to a small buffer and calls the handler of the current
state (``_st_<state>``) until a handler needs more text.  A handler consumes a prefix of the
buffer; text that may be the start of a tag (``"</para"``) stays in the buffer, *held back*, until
the next feed decides it.  ``finish()`` runs the handlers once more with nothing held back, then
accepts a call that only lacks its closing tag, or returns a malformed call as content.

Invariants:
- Any split of the same text over ``feed`` calls gives the same concatenated content, the same
  tool calls and the same per-call concatenated arguments.  Each character is looked at O(1)
  times (plus a look-behind of at most one tag), so a stream costs time linear in its length.
- The B1 state (``inside_tool_call``, ``inside_parameter_body``, ``param_body_chars_emitted``)
  describes the *committed* text: what was consumed, not what is held back.  While ``"</para"``
  is held back inside a body, the parser is still inside that body and the count has not moved.
- A call whose text turns out malformed (a tag never closed, invalid JSON, garbage between tags)
  never raises and is never reported with made-up arguments: its whole raw text, tags included,
  comes back as content, and it is left out of ``completed_calls``.  If its header was already
  streamed, its index stays used.
- Whitespace between or around tool calls is dropped; whitespace inside content is kept, and
  trailing whitespace is kept at the end of a stream without a well-formed tool call.
"""

from __future__ import annotations

import functools
from typing import Protocol, runtime_checkable

from attrs import frozen
from loguru import logger

from metrale_core.streamparse.values import ArgsObjectWriter, index_tools

__all__ = [
    "CALL_CLOSE",
    "CALL_OPEN",
    "CompletedCall",
    "ParsedDelta",
    "TagParserBase",
    "ToolCallParser",
    "held_back_len",
    "scan_tags",
]

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
_WHITESPACE = " \t\r\n"


@frozen
class ParsedDelta:
    """One piece of a parsed stream: content, reasoning, or a piece of one tool call."""

    content: str = ""
    reasoning: str = ""
    #: Which tool call of the response this piece belongs to (0, 1, ... in order of appearance).
    tool_call_index: int | None = None
    #: Set on the first piece of a call only (``call_<16 hex>``).
    tool_call_id: str | None = None
    #: Set on the first piece of a call only.
    name: str | None = None
    #: A fragment of the call's arguments JSON; a call's fragments concatenate to its JSON object.
    arguments: str = ""


@frozen
class CompletedCall:
    """A tool call whose text was complete and well formed."""

    index: int
    name: str
    #: The JSON text of the arguments object (the concatenation of the streamed fragments).
    arguments: str


@runtime_checkable
class ToolCallParser(Protocol):
    """What ``ToolCallParserSpec.factory(tools=...)`` must return: one parser state per sequence.

    Header pieces (``tool_call_index`` and ``name``) carry no id; the stream parser adds it.
    Optional attributes the core reads with ``getattr``: ``keeps_special_tokens = True`` when the
    format's markers are special tokens (the engine then decodes this sequence without dropping
    them); ``new_call_id()`` for a format whose templates need another id shape (Mistral's 9
    characters); ``in_reasoning`` for a parser that also splits reasoning (harmony).
    """

    inside_tool_call: bool
    inside_parameter_body: bool
    param_body_chars_emitted: int
    completed_calls: list[CompletedCall]

    def feed(self, text: str) -> list[ParsedDelta]: ...

    def finish(self) -> list[ParsedDelta]: ...


def held_back_len(text: str, markers: str | tuple[str, ...], start: int = 0) -> int:
    """How many characters at the end of ``text[start:]`` to hold back while streaming.

    Contract: the length of the longest suffix of ``text[start:]`` that is a *proper* prefix of
    any of ``markers`` (one marker string, or a tuple of them); 0 when there is none.  Those
    characters may still grow into a marker, so a streaming parser keeps them until the next
    ``feed`` decides (and emits them at the end of the stream).  A complete marker is not a
    proper prefix of itself: find whole markers first, then hold back what this returns.
    Empty markers are ignored.  Only the last ``max(map(len, markers)) - 1`` characters are
    looked at, so calling it on every feed keeps a stream linear.

    >>> held_back_len("text </par", ("</parameter>", "</tool_call>"))
    5
    >>> held_back_len("abc", "[ARGS]")
    0
    """
    if isinstance(markers, str):
        markers = (markers,)
    longest, firsts = _marker_info(markers)
    end = len(text)
    for j in range(max(start, end - longest + 1), end):
        if text[j] in firsts:
            rest = text[j:]
            if any(len(marker) > len(rest) and marker.startswith(rest) for marker in markers):
                return end - j
    return 0


@functools.lru_cache(maxsize=64)
def _marker_info(markers: tuple[str, ...]) -> tuple[int, frozenset[str]]:
    """The longest marker's length and the markers' first characters (empty markers ignored)."""
    return max(map(len, markers), default=0), frozenset(m[0] for m in markers if m)


def scan_tags(text: str, start: int, tags: tuple[str, ...], final: bool) -> tuple[int, str | None]:
    """The earliest of ``tags`` in ``text[start:]`` as ``(position, tag)``.

    Without a match, ``(end, None)`` where ``text[end:]`` is held back: the longest suffix that
    could still grow into a tag (nothing is held back when ``final``).  At equal positions the
    longer tag wins, so ``"\\n</parameter>"`` beats ``"</parameter>"`` one character later by
    position and neither ever splits the other.
    """
    best, found = -1, None
    for tag in tags:
        i = text.find(tag, start)
        if i >= 0 and (found is None or i < best or (i == best and len(tag) > len(found))):
            best, found = i, tag
    if found is not None:
        return best, found
    if final:
        return len(text), None
    return len(text) - held_back_len(text, tags, start), None


class TagParserBase:
    """Buffer driver, content outside calls, call bookkeeping, fallback and B1 state.

    Subclasses implement ``_st_<state>(final) -> bool`` handlers for their call states (return
    False when more text is needed) and :meth:`_complete_at_eos`.  ``call_open`` starts a call;
    ``call_close`` ends one (None: the call's own grammar ends it, and a malformed call runs to
    the next ``call_open`` or the end of the stream).
    """

    #: The tag that opens a tool call.
    call_open: str = CALL_OPEN
    #: The tag that closes a tool call (None: the format has none).
    call_close: str | None = CALL_CLOSE

    def __init__(self, tools: list[dict] | None = None) -> None:
        #: tool name -> {parameter name -> JSON-schema of the parameter}
        self.tool_schemas = index_tools(tools)
        self.completed_calls: list[CompletedCall] = []
        self.inside_tool_call = False
        self.inside_parameter_body = False
        self.param_body_chars_emitted = 0
        self._buf = ""
        self._pos = 0
        self._state = "out"
        self._out: list[ParsedDelta] = []
        self._pending_ws = ""
        self._finished = False
        self._next_index = 0
        self._reset_call()

    # --- public ------------------------------------------------------------------------------
    def feed(self, text: str) -> list[ParsedDelta]:
        if text:
            self._buf = self._buf[self._pos :] + text
            self._pos = 0
            self._drive(final=False)
        return self._take()

    def finish(self) -> list[ParsedDelta]:
        if self._finished:
            return []
        self._finished = True
        self._drive(final=True)
        if self.inside_tool_call:
            if self._complete_at_eos():
                self._complete_call()
            else:
                self._fallback("the stream ended inside the tool call")
        if self._pending_ws and not self.completed_calls:
            self._out.append(ParsedDelta(content=self._pending_ws))
        self._pending_ws = ""
        return self._take()

    # --- driver ------------------------------------------------------------------------------
    def _drive(self, final: bool) -> None:
        while self._pos < len(self._buf):
            if not getattr(self, "_st_" + self._state)(final):
                break

    def _take(self) -> list[ParsedDelta]:
        out, self._out = self._out, []
        return out

    def _consume(self, end: int) -> str:
        """Consume ``buf[pos:end]``; inside a call it is kept as raw text for a fallback."""
        piece = self._buf[self._pos : end]
        self._pos = end
        if self.inside_tool_call and piece:
            self._raw.append(piece)
        return piece

    def _skip_ws(self) -> bool:
        """Consume whitespace; False when the buffer ran out."""
        buf, i = self._buf, self._pos
        while i < len(buf) and buf[i] in _WHITESPACE:
            i += 1
        self._consume(i)
        return i < len(buf)

    def _expect(self, tags: tuple[str, ...], final: bool) -> str | bool | None:
        """After optional whitespace, consume one of ``tags`` and return it.

        None: more text is needed (a partial tag, or only whitespace so far).  False: something
        else is there; the call is marked malformed.
        """
        if not self._skip_ws():
            return None
        rest = self._buf[self._pos : self._pos + max(map(len, tags))]
        for tag in tags:
            if rest.startswith(tag):
                self._consume(self._pos + len(tag))
                return tag
        if not final and any(tag.startswith(rest) for tag in tags):
            return None
        self._malformed(f"expected {' or '.join(tags)}, got {rest!r}")
        return False

    # --- outside calls -----------------------------------------------------------------------
    def _st_out(self, final: bool) -> bool:
        i, tag = scan_tags(self._buf, self._pos, (self.call_open,), final)
        self._content(self._consume(i))
        if tag is None:
            return False
        self._consume(i + len(tag))
        self._open_call()
        return True

    def _content(self, text: str) -> None:
        if not text:
            return
        core = text.rstrip(_WHITESPACE)
        if not core:
            self._pending_ws += text
            return
        self._out.append(ParsedDelta(content=self._pending_ws + core))
        self._pending_ws = text[len(core) :]

    # --- call bookkeeping --------------------------------------------------------------------
    def _reset_call(self) -> None:
        self._raw: list[str] = []
        self._index: int | None = None
        self._name: str | None = None
        self._args: list[str] = []
        self._writer: ArgsObjectWriter | None = None
        self._why = ""
        self.inside_tool_call = False
        self._close_body()

    def _open_call(self) -> None:
        self._raw = [self._pending_ws, self.call_open]
        self._pending_ws = ""
        self.inside_tool_call = True
        self._state = self._first_call_state()

    def _first_call_state(self) -> str:
        return "call"

    def _send_header(self, name: str) -> None:
        self._name = name
        self._index = self._next_index
        self._next_index += 1
        self._out.append(ParsedDelta(tool_call_index=self._index, name=name))
        if self._args:  # arguments that arrived before the name
            self._out.append(ParsedDelta(tool_call_index=self._index, arguments="".join(self._args)))

    def _send_args(self, fragment: str) -> None:
        if not fragment:
            return
        self._args.append(fragment)
        if self._index is not None:
            self._out.append(ParsedDelta(tool_call_index=self._index, arguments=fragment))

    @property
    def _args_writer(self) -> ArgsObjectWriter:
        """The open call's argument writer (the parse states that read it run inside a call)."""
        assert self._writer is not None, "no tool call's arguments are open"
        return self._writer

    def _new_writer(self) -> ArgsObjectWriter:
        schema = self.tool_schemas.get(self._name or "", {})
        self._writer = ArgsObjectWriter(schema)
        return self._writer

    def _complete_call(self) -> None:
        if self._writer is not None:
            self._send_args(self._writer.close())
        assert self._index is not None and self._name is not None, "a completed call has its header"
        self.completed_calls.append(CompletedCall(self._index, self._name, "".join(self._args)))
        self._reset_call()
        self._state = "out"

    def _complete_at_eos(self) -> bool:
        """Whether the call the stream ended in is complete except for its closing tag."""
        raise NotImplementedError

    # --- malformed calls ---------------------------------------------------------------------
    def _malformed(self, why: str) -> None:
        """The call cannot be parsed: skip to its end, then return it as content."""
        self._why = why
        self._close_body()
        self._state = "skip"

    def _st_skip(self, final: bool) -> bool:
        tags = (self.call_open,) if self.call_close is None else (self.call_close, self.call_open)
        i, tag = scan_tags(self._buf, self._pos, tags, final)
        self._consume(i)
        if tag is not None and tag == self.call_close:
            self._consume(i + len(tag))
            self._fallback(self._why)
            return True
        if tag == self.call_open:  # a new call starts: the broken one ends here
            ended = "" if self.call_close is None else f" before {self.call_close}"
            self._fallback(self._why + f"; a new {self.call_open} began{ended}")
            return True
        return False

    def _fallback(self, why: str) -> None:
        raw = "".join(self._raw)
        if self._why and self._why not in why:
            why = f"{self._why}; {why}"
        logger.info(
            "tool call {} not parsed ({}); returned as content",
            f"#{self._index}" if self._index is not None else "",
            why,
        )
        self._reset_call()
        self._state = "out"
        self._content(raw)

    # --- B1 state ----------------------------------------------------------------------------
    def _open_body(self, chars: int = 0) -> None:
        self.inside_parameter_body = True
        self.param_body_chars_emitted = chars

    def _close_body(self) -> None:
        self.inside_parameter_body = False
        self.param_body_chars_emitted = 0
