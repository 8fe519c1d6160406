"""Bearer API-key check for the API routes (``--api-key`` / ``METRALE_API_KEY``).

Owner: the server app applies :func:`api_key_guard` to ``/v1/*``, ``/tokenize`` and
``/detokenize``; ``/health``, ``/metrics`` and the OpenAPI schema stay open (probes and scrapers).

Invariants:
- The comparison is constant-time (``hmac.compare_digest`` on bytes).
- A missing or wrong key is a 401 in OpenAI's shape with ``WWW-Authenticate: Bearer``.
"""

from __future__ import annotations

import hmac

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from metrale_core.server.errors import APIError

__all__ = ["api_key_guard", "key_matches"]


def key_matches(header: str | None, key: str) -> bool:
    """True when ``header`` is ``Bearer <key>`` (scheme case-insensitive)."""
    if not header:
        return False
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(token.strip().encode("utf-8"), key.encode("utf-8"))


def api_key_guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    key = connection.app.state.host.config.api_key
    if key is None:
        return
    if not key_matches(connection.headers.get("authorization"), key):
        raise APIError(
            401,
            "invalid or missing API key (send 'Authorization: Bearer <key>')",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
