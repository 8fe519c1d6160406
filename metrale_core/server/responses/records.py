"""Request record of the OpenAI Responses API (``POST /v1/responses``).

Owner: ``server.responses.route`` parses bodies into :class:`ResponsesRequest` with the server's
one strict decoder (``decode.parse_body``: unknown fields and wrong JSON types are a 400 naming
the path).  ``input`` items and ``tools``, whose shape depends on their ``type``, are checked by
``server.responses.translate``.

Invariants:
- Fields OpenAI documents but this server cannot honour (``background``, ``conversation``,
  ``prompt``, ``top_logprobs`` > 0) are accepted by the parser and refused with a 400 by the
  translation, never silently ignored.
"""

from __future__ import annotations

from typing import Annotated, Any

from metrale_core.server.decode import Body
from metrale_core.server.ranges import bounded

__all__ = ["ResponsesRequest"]


class ResponsesRequest(Body, frozen=True):
    """``POST /v1/responses``."""

    #: A string (one user message) or an array of input items.
    input: Any
    model: str | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    temperature: Annotated[float, bounded("temperature")] | None = None
    top_p: Annotated[float, bounded("top_p")] | None = None
    top_logprobs: Annotated[int, bounded("top_logprobs")] | None = None
    #: ``{"format": {"type": "text" | "json_object" | "json_schema", ...}, "verbosity": ...}``
    text: dict[str, Any] | None = None
    #: ``{"effort": "none" | "minimal" | "low" | "medium" | "high", "summary": ...}``
    reasoning: dict[str, Any] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, Any] | None = None
    truncation: str | None = None
    include: list[str] | None = None
    user: str | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # documented fields this server cannot honour
    background: bool | None = None
    conversation: Any = None
    prompt: dict[str, Any] | None = None
