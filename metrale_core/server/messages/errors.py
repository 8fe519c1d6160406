"""Anthropic-shaped errors and auth for the Messages routes.

Owner: ``server.messages.route`` mounts its handlers on a router with :func:`anthropic_handlers`
(handler-level exception handlers, so every failure under ``/v1/messages`` -- validation, auth,
body size, engine faults -- answers ``{"type": "error", "error": {"type", "message"}}``) and
:func:`anthropic_key_guard`.

Invariants:
- The message is the server's own (it names the offending field first, ``messages[1].role: ...``).
- ``x-api-key: <key>`` and ``Authorization: Bearer <key>`` are both accepted (Claude Code and
  older SDKs send the first, the 2.x SDK the second); comparison is constant-time.
- Only a genuine server fault is a 5xx.
"""

from __future__ import annotations

import hmac
from typing import Any

from litestar import Request, Response
from litestar.connection import ASGIConnection
from litestar.exceptions import HTTPException
from loguru import logger

from metrale_core.errors import RequestError
from metrale_core.server.auth import key_matches
from metrale_core.server.errors import APIError

__all__ = ["anthropic_error_body", "anthropic_handlers", "anthropic_key_guard"]

#: HTTP status -> Anthropic error ``type``.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    kind = _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _response(status: int, message: str, headers: dict | None = None) -> Response:
    return Response(
        anthropic_error_body(status, message), status_code=status, headers=headers or {}, media_type="application/json"
    )


def _api_error(_: Request, exc: APIError) -> Response:
    return _response(exc.status, exc.message, exc.headers)


def _request_error(_: Request, exc: RequestError) -> Response:
    return _response(400, str(exc))


def _http_error(request: Request, exc: HTTPException) -> Response:
    message = exc.detail or "error"
    if exc.status_code == 413:
        message = f"request body too large: {exc.detail}"
    elif exc.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    return _response(exc.status_code, message, dict(exc.headers or {}))


def _unexpected(request: Request, exc: Exception) -> Response:
    logger.opt(exception=exc).error("unhandled error on {} {}", request.method, request.url.path)
    return _response(500, f"internal server error ({type(exc).__name__})")


def anthropic_handlers() -> dict:
    return {APIError: _api_error, RequestError: _request_error, HTTPException: _http_error, Exception: _unexpected}


def anthropic_key_guard(connection: ASGIConnection, _: Any) -> None:
    key = connection.app.state.host.config.api_key
    if key is None:
        return
    given = connection.headers.get("x-api-key")
    if given is not None and hmac.compare_digest(given.encode("utf-8"), key.encode("utf-8")):
        return
    if key_matches(connection.headers.get("authorization"), key):
        return
    raise APIError(401, "invalid or missing API key (send 'x-api-key: <key>' or 'Authorization: Bearer <key>')")
