"""Request records of the Anthropic Messages API (``POST /v1/messages``, ``.../count_tokens``).

Owner: ``server.messages.route`` parses bodies into these with the server's one strict converter
(``schemas.parse_body``: unknown fields and wrong JSON types are a 400 naming the path); the
content blocks, whose shape depends on their ``type``, are checked by ``server.messages.translate``.

Invariants:
- ``max_tokens`` is required on ``/v1/messages`` (as Anthropic requires) and absent from
  ``count_tokens``.
- ``temperature`` / ``top_p`` / ``top_k`` are optional (the 2.x ``anthropic`` client sends them
  only through ``extra_body``).
"""

from __future__ import annotations

from typing import Any

from attrs import frozen

__all__ = ["AnthropicMessage", "AnthropicTool", "CountTokensRequest", "MessagesRequest"]


@frozen(kw_only=True)
class AnthropicMessage:
    """One turn: ``content`` is a string or an array of content blocks."""

    role: str
    content: Any


@frozen(kw_only=True)
class AnthropicTool:
    """A client tool (``input_schema`` is a JSON Schema of the input object)."""

    name: str
    input_schema: dict[str, Any] | None = None
    description: str | None = None
    type: str | None = None
    cache_control: dict[str, Any] | None = None
    strict: bool | None = None


@frozen(kw_only=True)
class CountTokensRequest:
    """The prompt part of a Messages request (``POST /v1/messages/count_tokens``)."""

    model: str
    messages: list[AnthropicMessage]
    system: Any = None
    tools: list[AnthropicTool] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None


@frozen(kw_only=True)
class MessagesRequest(CountTokensRequest):
    """``POST /v1/messages``."""

    max_tokens: int
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
