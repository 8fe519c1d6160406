"""The ``qwen3_coder`` tool-call format (Qwen3-Coder, Qwen3.5): XML-like functions and parameters.

Owner: registered by ``metrale_core.plugin.builtins`` as tool-call parser ``qwen3_coder``; one
:class:`Qwen3CoderParser` per sequence.

Format (specs §5.2)::

    <tool_call>\\n<function=NAME>\\n<parameter=P1>\\nVALUE1\\n</parameter>\\n...</function>\\n</tool_call>

A value ends at ``</parameter>``, or (tag missing) at the next ``<parameter=``, ``</function>`` or
``</tool_call>``; one leading and one trailing ``\\n`` are not part of it.  Values are converted by
the tool's schema type (``values.ArgsObjectWriter``): strings stream as JSON string fragments,
other types are sent when the value ends.  ``</function>`` may be missing before
``</tool_call>``; ``</tool_call>`` may be missing at the end of the stream after ``</function>``.

B1 body: from right after ``<parameter=NAME>`` until the value ends.  The leading ``\\n`` is
inside the body but not counted.  A ``\\n`` that may be the trailing newline before a closing tag,
and a partial closing tag, are held back, so they are not counted until the text after them shows
they are value text (``"a\\n"`` counts 1; ``"a\\nb"`` counts 3).

Invariants: those of ``TagParserBase``.
"""

from __future__ import annotations

import re

from metrale_core.streamparse.base import CALL_CLOSE, TagParserBase, scan_tags

__all__ = ["Qwen3CoderParser", "read_name"]

FUNCTION_OPEN = "<function="
FUNCTION_CLOSE = "</function>"
PARAM_OPEN = "<parameter="
PARAM_CLOSE = "</parameter>"
_VALUE_ENDS = tuple(t for tag in (PARAM_CLOSE, PARAM_OPEN, FUNCTION_CLOSE, CALL_CLOSE) for t in ("\n" + tag, tag))
_NAME_RUN = re.compile(r"[^>\n<]*")
#: What a function or parameter name may be.
NAME = re.compile(r"[\w.\-:/]+")


def read_name(parser: TagParserBase, parts: list[str], what: str) -> str | bool | None:
    """Read a tag attribute up to ``>`` into ``parts``; the name, None (more text) or False (bad)."""
    m = _NAME_RUN.match(parser._buf, parser._pos)
    assert m is not None  # the pattern matches the empty string
    parts.append(parser._consume(m.end()))
    if m.end() == len(parser._buf):
        return None
    name = "".join(parts).strip()
    if parser._buf[m.end()] != ">" or not NAME.fullmatch(name):
        parser._malformed(f"invalid {what} name {''.join(parts)!r}")
        return False
    parser._consume(m.end() + 1)
    return name


class Qwen3CoderParser(TagParserBase):
    """Streaming parser of ``<function=...><parameter=...>`` tool calls."""

    def _complete_at_eos(self) -> bool:
        return self._state == "end"

    def _st_call(self, final: bool) -> bool:
        tag = self._expect((FUNCTION_OPEN,), final)
        if tag:
            self._parts: list[str] = []
            self._state = "fname"
        return tag is not None

    def _st_fname(self, final: bool) -> bool:
        name = read_name(self, self._parts, "function")
        if isinstance(name, str):
            self._send_header(name)
            self._new_writer()
            self._state = "fbody"
        return name is not None

    def _st_fbody(self, final: bool) -> bool:
        tag = self._expect((PARAM_OPEN, FUNCTION_CLOSE, CALL_CLOSE), final)
        if tag == PARAM_OPEN:
            self._parts = []
            self._state = "pname"
        elif tag == FUNCTION_CLOSE:
            self._send_args(self._args_writer.close())
            self._writer = None
            self._state = "end"
        elif tag == CALL_CLOSE:  # </function> is missing
            self._complete_call()
        return tag is not None

    def _st_pname(self, final: bool) -> bool:
        name = read_name(self, self._parts, "parameter")
        if isinstance(name, str):
            self._send_args(self._args_writer.begin(name))
            self._open_body()
            self._state = "pnl"
        return name is not None

    def _st_pnl(self, final: bool) -> bool:
        if self._buf[self._pos] == "\n":
            self._consume(self._pos + 1)
        self._state = "value"
        return True

    def _st_value(self, final: bool) -> bool:
        i, tag = scan_tags(self._buf, self._pos, _VALUE_ENDS, final)
        value = self._consume(i)
        self.param_body_chars_emitted += len(value)
        self._send_args(self._args_writer.add(value))
        if tag is None:
            return False
        # </parameter> is consumed here; the other closers belong to the function body
        self._consume(i + (len(tag) if tag.endswith(PARAM_CLOSE) else tag.startswith("\n")))
        self._send_args(self._args_writer.end())
        self._close_body()
        self._state = "fbody"
        return True

    def _st_end(self, final: bool) -> bool:
        tag = self._expect((CALL_CLOSE,), final)
        if tag:
            self._complete_call()
        return tag is not None
