"""Request records of the Anthropic Messages API (``POST /v1/messages``, ``.../count_tokens``).

Owner: ``server.messages.route`` parses bodies into these with the server's one strict decoder
(``decode.parse_body``: unknown fields and wrong JSON types are a 400 naming the path); the
content blocks, whose shape depends on their ``type``, are checked by ``server.messages.translate``.

Invariants:
- ``max_tokens`` is required on ``/v1/messages`` (as Anthropic requires) and absent from
  ``count_tokens``.
- ``temperature`` / ``top_p`` / ``top_k`` are optional (the 2.x ``anthropic`` client sends them
  only through ``extra_body``).
"""

from __future__ import annotations

from typing import Annotated, Any

from metrale_core.server.decode import Body, Record
from metrale_core.server.ranges import bounded

__all__ = ["AnthropicMessage", "AnthropicTool", "CountTokensRequest", "MessagesRequest"]


class AnthropicMessage(Record, frozen=True):
    """One turn: ``content`` is a string or an array of content blocks."""

    role: str
    content: Any


class AnthropicTool(Record, frozen=True):
    """A client tool (``input_schema`` is a JSON Schema of the input object)."""

    name: str
    input_schema: dict[str, Any] | None = None
    description: str | None = None
    type: str | None = None
    cache_control: dict[str, Any] | None = None
    strict: bool | None = None


class CountTokensRequest(Body, frozen=True):
    """The prompt part of a Messages request (``POST /v1/messages/count_tokens``)."""

    model: str
    messages: list[AnthropicMessage]
    system: Any = None
    tools: list[AnthropicTool] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest, kw_only=True, frozen=True):
    """``POST /v1/messages``."""

    max_tokens: Annotated[int, bounded("max_tokens")]
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: Annotated[float, bounded("temperature")] | None = None
    top_p: Annotated[float, bounded("top_p")] | None = None
    top_k: Annotated[int, bounded("top_k")] | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
