"""Streaming parsers of generated text: reasoning (``<think>``) and tool calls.

Owner: the server builds one :class:`StreamParser` per sequence with :func:`make_stream_parser`
and passes it to the engine as ``extras={"stream_parser": parser}``; the engine feeds it and puts
the parsed pieces on ``RequestOutput.parsed``.  Tool-call formats are plugins
(``metrale_tool_call_parsers`` hook); the built-ins are ``hermes``, ``qwen3_coder``, ``glm47``,
``mistral``, ``granite``, ``phi4_mini`` and ``harmony`` (gpt-oss: it also splits the reasoning).
A plugin parser may use :func:`held_back_len` to hold back a possible partial marker at the end
of the streamed text, as the built-ins do.

Invariants: see ``parser`` (stream guarantees) and ``base`` (parser contract, B1 state).
"""

from __future__ import annotations

from metrale_core.streamparse.base import CompletedCall, ParsedDelta, ToolCallParser, held_back_len
from metrale_core.streamparse.parser import (
    BUILTIN_TOOL_PARSERS,
    StreamParser,
    StreamParserClosed,
    default_reasoning,
    make_stream_parser,
    new_tool_call_id,
)
from metrale_core.streamparse.reasoning import REASONING_FORMATS, ReasoningSplitter

__all__ = [
    "BUILTIN_TOOL_PARSERS",
    "REASONING_FORMATS",
    "CompletedCall",
    "ParsedDelta",
    "ReasoningSplitter",
    "StreamParser",
    "StreamParserClosed",
    "ToolCallParser",
    "default_reasoning",
    "held_back_len",
    "make_stream_parser",
    "new_tool_call_id",
]
