"""What every generating route does first: read and validate the body, check the model name.

Owner: the chat, completions and tokenize routes.

Invariants:
- Only ``application/json`` bodies are read (415 otherwise); the size limit is Litestar's
  ``request_max_body_size`` (413), so an oversized body is never buffered in full.
- The body is parsed and validated on a frontend worker thread (``offload``), never on the
  event loop.
- A whole (non-streaming) response is computed under :func:`while_connected`: a client that
  disconnects aborts its engine requests at once, as a streaming client does.
- The ``model`` field, when given, must name the served model (404 ``model_not_found``).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Awaitable

from litestar import Request

from metrale_core.server.errors import APIError
from metrale_core.server.memory import after_large_body
from metrale_core.server.offload import off_loop
from metrale_core.server.schemas import check_ranges, parse_body

__all__ = ["ClientGone", "check_model", "new_id", "read_request", "usage", "while_connected"]


async def read_request(request: Request, cls: type) -> Any:
    """The body of ``request`` as a validated ``cls``."""
    media = (request.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise APIError(415, f"the request body must be JSON (Content-Type: application/json), "
                            f"got {media or 'no Content-Type'}")
    return await off_loop(_parse, await request.body(), cls)


def _parse(body: bytes, cls: type) -> Any:
    try:
        parsed = parse_body(body, cls)
        check_ranges(parsed)
    finally:
        after_large_body(len(body))
    return parsed


class ClientGone(APIError):
    """The client disconnected before a whole (non-streaming) response was ready."""

    def __init__(self) -> None:
        super().__init__(499, "the client closed the connection", code="client_closed_request",
                         type="invalid_request_error")


async def _disconnected(request: Request) -> None:
    """Return once the client has disconnected (the body has already been read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
        if not message.get("more_body", False) and not message.get("body"):
            await asyncio.sleep(0.05)  # a stray empty body message: do not spin


async def while_connected(request: Request, work: Awaitable[Any]) -> Any:
    """``await work``, cancelled at once (aborting its engine requests) if the client
    disconnects first; then :class:`ClientGone` is raised (logged as 499, sent nowhere)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
    if task.cancelled():
        raise ClientGone()
    return task.result()


def check_model(host: Any, model: str | None) -> str:
    """The served model name; 404 when ``model`` names another one."""
    name = host.config.served_model_name
    if model is not None and model != name:
        raise APIError(404, f"the model {model!r} does not exist; this server serves {name!r}",
                       param="model", code="model_not_found")
    return name


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
