"""``IncrementalDetokenizer``: the text delta each new batch of output tokens adds, for streaming.

Owner: the engine's output processor (one instance per sequence).

Method (vLLM's prefix/read offsets): only a short window of recent ids is decoded per step.
``prefix_offset..read_offset`` is the tail that has already been emitted; the new text is the
decode of ``prefix_offset..end`` minus the decode of ``prefix_offset..read_offset``.  Decoding the
window in context keeps tokenizers whose decoder depends on neighbours (SentencePiece's leading
space) right, and the prompt's last tokens seed the context.

Invariants:
- Text is never re-emitted and never taken back.
- While the decoded tail ends in U+FFFD (a multi-byte UTF-8 character split over byte-level
  tokens) nothing is emitted; the character appears whole once its last byte arrives.
- For byte-level tokenizers, ``"".join(push(...) deltas) + flush() == tok.decode(output_ids)``
  whenever the prompt ends on a character boundary (an unfinished character at the very end of
  the stream comes out of ``flush()`` as U+FFFD, as ``decode`` renders it).
- Each step costs two decodes of a window of about ``_CONTEXT`` tokens, not of the whole sequence.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from attrs import define, field

__all__ = ["IncrementalDetokenizer"]

#: Prompt tokens kept as decoding context for the first output tokens (vLLM uses 5).
_CONTEXT = 5
_REPLACEMENT = "\ufffd"


class Decoder(Protocol):
    """What the detokenizer needs of a tokenizer."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


def _as_list(ids: Iterable[int]) -> list[int]:
    return list(ids)


@define
class IncrementalDetokenizer:
    """Streaming decoder of one sequence's output ids.  ``tok`` needs ``decode(ids, skip_special_tokens)``."""

    tok: Decoder
    prompt_ids: list[int] = field(converter=_as_list)
    skip_special_tokens: bool = True
    _ids: list[int] = field(init=False)
    _prefix_offset: int = field(init=False)
    _read_offset: int = field(init=False)
    #: decode(_ids[_prefix_offset:_read_offset]), cached between steps
    _prefix_text: str = field(init=False)
    #: total text emitted so far (what a client has received)
    text: str = field(init=False, default="")

    def __attrs_post_init__(self) -> None:
        self._ids = self.prompt_ids[-_CONTEXT:]
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._prefix_text = self._decode(self._ids)

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=self.skip_special_tokens) if ids else ""

    def push(self, token_ids: Sequence[int]) -> str:
        """Append new output ids; return the text they complete (possibly ``""``)."""
        if not token_ids:
            return ""
        self._ids.extend(int(t) for t in token_ids)
        new_text = self._decode(self._ids[self._prefix_offset :])
        if len(new_text) <= len(self._prefix_text) or new_text.endswith(_REPLACEMENT):
            return ""  # nothing visible yet, or an unfinished character: hold back
        return self._advance(new_text)

    def flush(self) -> str:
        """At the end of the stream: whatever is still held back (an unfinished character as U+FFFD)."""
        new_text = self._decode(self._ids[self._prefix_offset :])
        return self._advance(new_text) if len(new_text) > len(self._prefix_text) else ""

    def _advance(self, new_text: str) -> str:
        delta = new_text[len(self._prefix_text) :]
        # the window becomes what was just read; older ids are dropped so memory stays bounded
        self._ids = self._ids[self._read_offset :]
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._prefix_text = self._decode(self._ids)
        self.text += delta
        return delta
