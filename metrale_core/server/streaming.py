"""Server-sent events in OpenAI's wire format: ``data: {json}\\n\\n`` ... ``data: [DONE]\\n\\n``.

Owner: the chat and completions routes wrap their chunk generators with :func:`sse_response`.

Invariants:
- The last event is always ``data: [DONE]``; a failure after the first byte (the status line is
  already sent) becomes one ``data: {"error": {...}}`` event before it.
- A client that disconnects cancels the chunk generator (Litestar cancels the streaming task);
  the generator's ``finally`` blocks abort the engine requests, so their KV blocks are freed at
  once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
from litestar.response import Stream
from loguru import logger

from metrale_core.errors import MetraleError
from metrale_core.server.errors import APIError, error_body

__all__ = ["sse_event", "sse_response"]

DONE = b"data: [DONE]\n\n"
_encode = msgspec.json.Encoder().encode


def sse_event(payload: dict[str, Any]) -> bytes:
    """One ``data:`` event: compact UTF-8 JSON (msgspec, several times faster than ``json``)."""
    return b"data: " + _encode(payload) + b"\n\n"


async def _events(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    try:
        async for chunk in chunks:
            yield sse_event(chunk)
    except APIError as exc:
        yield sse_event(exc.body())
    except MetraleError as exc:
        yield sse_event(error_body(str(exc), "invalid_request_error"))
    except Exception as exc:
        logger.opt(exception=exc).error("stream failed")
        yield sse_event(error_body(f"internal server error ({type(exc).__name__})", "server_error"))
    yield DONE


def sse_response(chunks: AsyncIterator[dict[str, Any]]) -> Stream:
    """A ``text/event-stream`` response streaming ``chunks`` then ``[DONE]``."""
    return Stream(
        _events(chunks),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
