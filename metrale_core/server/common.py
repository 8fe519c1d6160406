"""What every generating route does first: read and validate the body, check the model name.

Owner: the chat, completions and tokenize routes.

Invariants:
- Only ``application/json`` bodies are read (415 otherwise); the size limit is Litestar's
  ``request_max_body_size`` (413), so an oversized body is never buffered in full.
- The ``model`` field, when given, must name the served model (404 ``model_not_found``).
"""

from __future__ import annotations

import uuid
from typing import Any

from litestar import Request

from metrale_core.server.errors import APIError
from metrale_core.server.schemas import check_ranges, parse_body

__all__ = ["check_model", "new_id", "read_request", "usage"]


async def read_request(request: Request, cls: type) -> Any:
    """The body of ``request`` as a validated ``cls``."""
    media = (request.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise APIError(415, f"the request body must be JSON (Content-Type: application/json), "
                            f"got {media or 'no Content-Type'}")
    parsed = parse_body(await request.body(), cls)
    check_ranges(parsed)
    return parsed


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
