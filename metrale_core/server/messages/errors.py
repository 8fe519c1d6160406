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
from functools import partial
from typing import Any

from litestar.connection import ASGIConnection

from metrale_core.server.auth import key_matches
from metrale_core.server.deps import body_post
from metrale_core.server.errors import APIError, shaped_handlers

__all__ = ["anthropic_error_body", "anthropic_handlers", "anthropic_key_guard", "anthropic_post"]

#: :func:`~metrale_core.server.deps.body_post` for a Messages route: tagged ``anthropic``, its
#: errors documented in Anthropic's shape (:func:`anthropic_handlers` answers them so).
anthropic_post = partial(body_post, tag="anthropic", errors="anthropic")

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


def anthropic_handlers() -> dict:
    return shaped_handlers(anthropic_error_body)


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
