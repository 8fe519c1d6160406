"""Request records of the Ollama API (``/api/chat``, ``/api/generate``, ``/api/embed``, ...).

Owner: ``server.ollama.route`` / ``server.ollama.info`` parse bodies into these with the server's
one strict decoder (``decode.parse_body``: wrong JSON types are a 400 naming the path).

Invariants:
- Every field Ollama's API documents is accepted (``keep_alive``, ``truncate``, ``shift``, ...);
  an undocumented field is a 400 naming it, as on the other APIs.
- ``stream`` defaults to true on ``/api/chat`` and ``/api/generate``, as Ollama's does.
- ``options`` is an object checked key by key by ``server.ollama.options`` (unknown options are
  ignored, as Ollama ignores them); ``format`` is ``"json"``, ``""`` or a JSON schema object.
"""

from __future__ import annotations

from typing import Annotated, Any

from metrale_core.server.decode import Body, Record
from metrale_core.server.ranges import bounded

__all__ = [
    "OllamaChatRequest",
    "OllamaEmbedRequest",
    "OllamaEmbeddingsRequest",
    "OllamaGenerateRequest",
    "OllamaMessage",
    "OllamaModelRequest",
    "OllamaPullRequest",
]


class OllamaToolFunction(Record, frozen=True):
    name: str
    arguments: dict[str, Any] | None = None
    index: int | None = None


class OllamaToolCall(Record, frozen=True):
    """A tool call in an assistant turn of the history (``arguments`` is an object)."""

    function: OllamaToolFunction
    id: str | None = None
    type: str | None = None


class OllamaMessage(Record, frozen=True):
    role: str
    content: str | None = None
    thinking: str | None = None
    images: list[str] | None = None
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class _GenerationRequest(Body, frozen=True):
    """What chat and generate share."""

    model: str
    stream: bool = True
    format: Any = None
    options: dict[str, Any] | None = None
    keep_alive: Any = None
    think: Any = None
    truncate: bool | None = None
    shift: bool | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, bounded("top_logprobs")] | None = None


class OllamaChatRequest(_GenerationRequest, kw_only=True, frozen=True):
    """``POST /api/chat``."""

    messages: list[OllamaMessage] | None = None
    tools: list[dict[str, Any]] | None = None


class OllamaGenerateRequest(_GenerationRequest, kw_only=True, frozen=True):
    """``POST /api/generate``."""

    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool | None = None
    images: list[str] | None = None
    #: Image generation (experimental in Ollama); refused here.
    width: int | None = None
    height: int | None = None
    steps: int | None = None


class OllamaModelRequest(Body, frozen=True):
    """``POST /api/show`` (``name`` is the legacy spelling of ``model``)."""

    model: str | None = None
    name: str | None = None
    verbose: bool | None = None


class OllamaEmbedRequest(Body, frozen=True):
    """``POST /api/embed``."""

    model: str
    #: A string or an array of strings (required; the route says so when it is missing).
    input: str | list[str] | None = None
    truncate: bool = True
    options: dict[str, Any] | None = None
    keep_alive: Any = None
    dimensions: int | None = None


class OllamaEmbeddingsRequest(Body, frozen=True):
    """``POST /api/embeddings`` (legacy: one ``prompt``, one ``embedding``)."""

    model: str
    prompt: str
    options: dict[str, Any] | None = None
    keep_alive: Any = None


class OllamaPullRequest(Body, frozen=True):
    """``POST /api/pull`` (``name`` is the legacy spelling of ``model``)."""

    model: str | None = None
    name: str | None = None
    insecure: bool | None = None
    stream: bool = True
    username: str | None = None
    password: str | None = None
