"""Splits ``<think>…</think>`` reasoning off the front of a generated stream.

Owner: :class:`metrale_core.streamparse.parser.StreamParser` runs one :class:`ReasoningSplitter`
before the tool-call parser; only the content it yields reaches the tool-call parser.

Behaviour.
- ``starts_in_reasoning=False``: the stream is content unless it begins (after optional
  whitespace) with ``<think>``; that tag and the whitespace before it are dropped.  A ``<think>``
  after content is content.
- ``starts_in_reasoning=True``: the prompt already opened ``<think>`` (templates that end the
  generation prompt with it); the stream is reasoning from its first character.
- Reasoning ends at ``</think>`` (dropped) or, in the glm variant, at ``<tool_call>``, which is
  kept and handed on as content so the tool-call parser sees it.  A stream that ends inside
  reasoning was all reasoning.  There is one reasoning span at most.
- A format with ``answer_tags`` (granite: ``<response>``, ``</response>``) drops them around the
  answer when the answer that follows the reasoning span opens with the first (after optional
  whitespace); the text after the closing tag is content again.

Invariants:
- Any split of the same text over ``feed`` calls gives the same reasoning and content.
- Only a partial tag (at most one tag long) or the leading whitespace before a possible
  ``<think>`` (at most :data:`MAX_LEADING_WS` characters) is ever held back.
"""

from __future__ import annotations

from attrs import frozen

from metrale_core.streamparse.base import scan_tags

__all__ = ["MAX_LEADING_WS", "REASONING_FORMATS", "ReasoningFormat", "ReasoningSplitter"]

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
#: Leading whitespace held while waiting for a ``<think>``; past this the stream is content.
MAX_LEADING_WS = 64


@frozen
class ReasoningFormat:
    """Which tags end a reasoning span."""

    name: str
    #: Tags that end reasoning and are dropped.
    close_tags: tuple[str, ...] = (THINK_CLOSE,)
    #: Tags that end reasoning and are handed on as content (glm: ``<tool_call>``).
    handover_tags: tuple[str, ...] = ()
    #: Tags around the answer after the reasoning, dropped (granite: ``<response>``...).
    answer_tags: tuple[str, str] | None = None


#: Reasoning formats by name (``make_stream_parser(reasoning=...)``).
REASONING_FORMATS: dict[str, ReasoningFormat] = {
    "qwen3": ReasoningFormat("qwen3"),
    "think": ReasoningFormat("think"),
    "deepseek_r1": ReasoningFormat("deepseek_r1"),
    "glm45": ReasoningFormat("glm45", handover_tags=("<tool_call>",)),
    "glm47": ReasoningFormat("glm47", handover_tags=("<tool_call>",)),
    "granite": ReasoningFormat("granite", answer_tags=("<response>", "</response>")),
}


class ReasoningSplitter:
    """Streaming splitter: ``feed(text)`` -> ``[("reasoning" | "content", text), ...]``."""

    def __init__(self, fmt: ReasoningFormat | None = None, starts_in_reasoning: bool = False) -> None:
        self.format = fmt if fmt is not None else REASONING_FORMATS["think"]
        self._tags = self.format.close_tags + self.format.handover_tags
        self._state = "reasoning" if starts_in_reasoning else "start"
        self._buf = ""
        self._finished = False

    @property
    def in_reasoning(self) -> bool:
        """True while the committed text is inside the reasoning span."""
        return self._state == "reasoning"

    def feed(self, text: str) -> list[tuple[str, str]]:
        if self._state == "content":
            return [("content", text)] if text else []
        self._buf += text
        return self._run(final=False)

    def finish(self) -> list[tuple[str, str]]:
        if self._finished:
            return []
        self._finished = True
        return self._run(final=True)

    def _run(self, final: bool) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if self._state == "start":
            self._start(final)
        if self._state == "reasoning" and self._buf:
            i, tag = scan_tags(self._buf, 0, self._tags, final)
            if i:
                out.append(("reasoning", self._buf[:i]))
            if tag is None:
                self._buf = self._buf[i:]
                return out
            self._state = "answer_start" if self.format.answer_tags else "content"
            self._buf = self._buf[i + len(tag) :] if tag in self.format.close_tags else self._buf[i:]
        if self._state == "answer_start":
            self._answer_start(final)
        if self._state == "answer" and self._buf:
            assert self.format.answer_tags is not None
            i, tag = scan_tags(self._buf, 0, self.format.answer_tags[1:], final)
            if i:
                out.append(("content", self._buf[:i]))
            self._buf = self._buf[i + len(tag) :] if tag is not None else self._buf[i:]
            if tag is None:
                return out
            self._state = "content"
        if self._state == "content" and self._buf:
            out.append(("content", self._buf))
            self._buf = ""
        return out

    def _answer_start(self, final: bool) -> None:
        assert self.format.answer_tags is not None
        self._opening(self.format.answer_tags[0], "answer", final)

    def _start(self, final: bool) -> None:
        self._opening(THINK_OPEN, "reasoning", final)

    def _opening(self, tag: str, inside: str, final: bool) -> None:
        """At the start of a part that may open with ``tag``: past the tag (and at most
        :data:`MAX_LEADING_WS` white space) go ``inside``; plain content once the buffer cannot
        begin with it (or on the ``final`` call); else wait for more text."""
        body = self._buf.lstrip()
        if len(self._buf) - len(body) > MAX_LEADING_WS:
            self._state = "content"
        elif body.startswith(tag):
            self._buf = body[len(tag) :]
            self._state = inside
        elif final or not tag.startswith(body):
            self._state = "content"
