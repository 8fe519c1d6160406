"""What every generating route does first: read and validate the body, check the model name.

Owner: the chat, completions and tokenize routes.

Invariants:
- Only ``application/json`` bodies are read (415 otherwise); the size limit is Litestar's
  ``request_max_body_size`` (413), so an oversized body is never buffered in full.
- The body is decoded and validated (``decode.parse_body``) on a frontend worker thread (``offload``), never on the
  event loop.
- A whole (non-streaming) response is computed under :func:`while_connected`: a client that
  disconnects aborts its engine requests at once, as a streaming client does.
- The ``model`` field, when given, must name the served model (404 ``model_not_found``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable
from typing import Any, TypeVar

from litestar import Request

from metrale_core.server.decode import Body, parse_body
from metrale_core.server.errors import APIError
from metrale_core.server.memory import after_large_body
from metrale_core.server.offload import off_loop

__all__ = ["ClientGone", "check_model", "new_id", "read_request", "usage", "while_connected"]

R = TypeVar("R", bound=Body)


async def read_request(request: Request, cls: type[R]) -> R:
    """The body of ``request`` as a validated ``cls``."""
    media = (request.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise APIError(
            415, f"the request body must be JSON (Content-Type: application/json), got {media or 'no Content-Type'}"
        )
    return await off_loop(_parse, await request.body(), cls)


def _parse(body: bytes, cls: type[R]) -> R:
    try:
        return parse_body(body, cls)
    finally:
        after_large_body(len(body))


class ClientGone(APIError):
    """The client disconnected before a whole (non-streaming) response was ready."""

    def __init__(self) -> None:
        super().__init__(
            499, "the client closed the connection", code="client_closed_request", type="invalid_request_error"
        )


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


def lora_bank(host: Any) -> Any:
    """The served engine's LoRA ``AdapterBank`` (None while loading or without adapters)."""
    served = getattr(host, "served", None)
    return None if served is None else getattr(getattr(served.engine, "runner", None), "lora", None)


def check_model(host: Any, model: str | None) -> str:
    """The served model name, or the LoRA adapter ``model`` names; 404 for any other name."""
    name = host.config.served_model_name
    if model is not None and model != name:
        bank = lora_bank(host)
        if bank is not None and bank.key_for(model) is not None:
            return model
        raise APIError(
            404,
            f"the model {model!r} does not exist; this server serves {name!r}",
            param="model",
            code="model_not_found",
        )
    return name


def adapter_extras(host: Any, model: str | None) -> dict[str, str]:
    """The engine extras that run a request on the adapter ``model`` names (empty: the base);
    404 when ``model`` names neither (e.g. an adapter unloaded meanwhile)."""
    if model is None or model == host.config.served_model_name:
        return {}
    bank = lora_bank(host)
    key = None if bank is None else bank.key_for(model)
    if key is None:
        check_model(host, model)  # raises the 404
        raise APIError(404, f"the LoRA adapter {model!r} is not loaded", param="model", code="model_not_found")
    from metrale_core.engine.adapter_key import ADAPTER_EXTRA

    return {ADAPTER_EXTRA: key}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
