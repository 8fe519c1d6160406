"""``ChatClient``: a streaming OpenAI chat client over HTTP (httpx + server-sent events).

Owner: the dashboard's chat tab.  It talks to the running server exactly as a user's client
would (``POST /v1/chat/completions`` with ``stream: true``), so the tab exercises the real API.

Invariants:
- :meth:`ChatClient.stream` yields :class:`ChatDelta` values as events arrive: answer text in
  ``content``, reasoning (``reasoning_content``, or ``reasoning``) apart in ``reasoning``, and
  the ``finish_reason`` on the last one.
- An HTTP error status or an ``{"error": ...}`` event raises :class:`ChatError` with the
  server's message; a connection failure raises ``ChatError`` naming the URL.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
from attrs import frozen

from metrale_core.errors import MetraleError

__all__ = ["ChatClient", "ChatDelta", "ChatError", "parse_sse_line"]


class ChatError(MetraleError):
    """The chat request failed (server error, bad status, unreachable server)."""


@frozen
class ChatDelta:
    content: str = ""
    reasoning: str = ""
    finish_reason: str | None = None


def parse_sse_line(line: str) -> dict[str, Any] | None:
    """The JSON payload of one ``data:`` line; None for other lines and ``[DONE]``."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if not data or data == "[DONE]":
        return None
    return json.loads(data)


def _delta(payload: dict[str, Any]) -> ChatDelta | None:
    if "error" in payload:
        error = payload["error"]
        message = error.get("message") if isinstance(error, dict) else str(error)
        raise ChatError(f"server error: {message}")
    choices = payload.get("choices") or []
    if not choices:
        return None
    choice = choices[0]
    delta = choice.get("delta") or {}
    return ChatDelta(
        content=delta.get("content") or "",
        reasoning=delta.get("reasoning_content") or delta.get("reasoning") or "",
        finish_reason=choice.get("finish_reason"),
    )


class ChatClient:
    """Streams chat completions from ``base_url`` (``http://host:port``)."""

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.transport = transport

    async def stream(
        self, messages: list[dict[str, str]], *, max_tokens: int | None = None, temperature: float = 0.0
    ) -> AsyncIterator[ChatDelta]:
        """Stream one reply; ``max_tokens`` None lets the server fill the context."""
        body: dict[str, Any] = {"messages": messages, "stream": True, "temperature": temperature}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if self.model:
            body["model"] = self.model
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        url = f"{self.base_url}/v1/chat/completions"
        try:
            async with (
                httpx.AsyncClient(timeout=self.timeout_s, transport=self.transport) as http,
                http.stream("POST", url, json=body, headers=headers) as response,
            ):
                if response.status_code != 200:
                    await response.aread()
                    raise ChatError(f"HTTP {response.status_code}: {_message(response)}")
                async for line in response.aiter_lines():
                    payload = parse_sse_line(line)
                    if payload is None:
                        continue
                    delta = _delta(payload)
                    if delta is not None:
                        yield delta
        except httpx.HTTPError as exc:
            raise ChatError(f"cannot reach {url}: {type(exc).__name__}: {exc}") from exc


def _message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error", {})
        return error.get("message") or response.text
    except (ValueError, AttributeError):
        return response.text[:200]
