"""The ``glm47`` tool-call format (GLM-4.7, GLM-5.x; GLM-4.5's newline variant is accepted too).

Owner: registered by ``metrale_core.plugin.builtins`` as tool-call parser ``glm47``; one
:class:`Glm47Parser` per sequence.

Format (specs §5.3)::

    <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>

The name ends at the first ``<arg_key>`` or ``</tool_call>`` (surrounding whitespace, as in
GLM-4.5's ``NAME\\n<arg_key>``, is dropped); whitespace between the tags is ignored.  Values are
raw text converted by the tool's schema type (``values.ArgsObjectWriter``), nothing stripped.
``</tool_call>`` may be missing at the end of the stream after a complete ``</arg_value>``.

The tags are matched on decoded text, so it does not matter whether the tokenizer has them as
single special tokens or spreads them over several tokens (the detokenizer must keep them: they
are not "special" to ``skip_special_tokens`` in GLM's tokenizer config).

B1 body: between ``<arg_value>`` and ``</arg_value>``; every value character counts once it is
committed (a partial ``</arg_value>`` is held back and not counted).

Invariants: those of ``TagParserBase``.
"""

from __future__ import annotations

from metrale_core.streamparse.base import CALL_CLOSE, TagParserBase, scan_tags
from metrale_core.streamparse.qwen3_coder import NAME

__all__ = ["Glm47Parser"]

KEY_OPEN = "<arg_key>"
KEY_CLOSE = "</arg_key>"
VALUE_OPEN = "<arg_value>"
VALUE_CLOSE = "</arg_value>"


class Glm47Parser(TagParserBase):
    """Streaming parser of GLM ``<arg_key>``/``<arg_value>`` tool calls."""

    def _first_call_state(self) -> str:
        self._parts: list[str] = []
        return "name"

    def _complete_at_eos(self) -> bool:
        return self._state == "args"

    def _read_until(self, tag_choices: tuple[str, ...], final: bool) -> str | None:
        """Collect text into ``_parts`` up to the first of ``tag_choices``; consume the tag."""
        i, tag = scan_tags(self._buf, self._pos, tag_choices, final)
        self._parts.append(self._consume(i))
        if tag is not None:
            self._consume(i + len(tag))
        return tag

    def _st_name(self, final: bool) -> bool:
        tag = self._read_until((KEY_OPEN, CALL_CLOSE), final)
        if tag is None:
            return False
        name = "".join(self._parts).strip()
        if not NAME.fullmatch(name):
            self._malformed(f"invalid function name {''.join(self._parts)!r}")
            self._fallback_if_closed(tag)
            return True
        self._send_header(name)
        self._new_writer()
        self._parts = []
        if tag == CALL_CLOSE:
            self._complete_call()
        else:
            self._state = "key"
        return True

    def _st_key(self, final: bool) -> bool:
        tag = self._read_until((KEY_CLOSE, VALUE_OPEN, KEY_OPEN, CALL_CLOSE), final)
        if tag is None:
            return False
        key = "".join(self._parts).strip()
        if tag != KEY_CLOSE or not key:
            self._malformed(
                f"<arg_key>{''.join(self._parts)} is not closed by </arg_key>"
                if tag != KEY_CLOSE
                else "empty <arg_key>"
            )
            self._fallback_if_closed(tag)
            return True
        self._key = key
        self._state = "preval"
        return True

    def _st_preval(self, final: bool) -> bool:
        tag = self._expect((VALUE_OPEN,), final)
        if tag:
            self._send_args(self._args_writer.begin(self._key))
            self._open_body()
            self._state = "value"
        return tag is not None

    def _st_value(self, final: bool) -> bool:
        i, tag = scan_tags(self._buf, self._pos, (VALUE_CLOSE,), final)
        value = self._consume(i)
        self.param_body_chars_emitted += len(value)
        self._send_args(self._args_writer.add(value))
        if tag is None:
            return False
        self._consume(i + len(tag))
        self._send_args(self._args_writer.end())
        self._close_body()
        self._state = "args"
        return True

    def _st_args(self, final: bool) -> bool:
        tag = self._expect((KEY_OPEN, CALL_CLOSE), final)
        if tag == KEY_OPEN:
            self._parts = []
            self._state = "key"
        elif tag == CALL_CLOSE:
            self._complete_call()
        return tag is not None

    def _fallback_if_closed(self, tag: str) -> None:
        if tag == CALL_CLOSE:  # the bad call already ended: no need to skip to its end
            self._fallback(self._why)
