"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` for every failure.

Owner: the server.  Route code raises :class:`APIError` (or lets a ``RequestError`` out); the
exception handlers registered by :func:`exception_handlers` turn it, Litestar's own HTTP errors
(404, 405, 413, ...) and anything unexpected into one JSON shape.

Invariants:
- Bad input is always a 4xx: ``RequestError`` (invalid request, prompt too long) maps to 400.
- Only a genuine server fault is a 5xx, and its message never includes a traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException
from loguru import logger

from metrale_core.errors import MetraleError, RequestError

__all__ = ["APIError", "error_body", "error_response", "exception_handlers", "shaped_handlers"]

#: HTTP status -> OpenAI error ``type``.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    501: "not_implemented_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


class APIError(MetraleError):
    """An error answered to the client with ``status`` and an OpenAI-shaped body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | int | None = None) -> dict[str, Any]:
    """The OpenAI error object."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(err: APIError) -> Response:
    return Response(err.body(), status_code=err.status, headers=err.headers, media_type="application/json")


def _api_error(_: Request, exc: APIError) -> Response:
    return error_response(exc)


def _request_error(_: Request, exc: RequestError) -> Response:
    return error_response(APIError(400, str(exc)))


def _http_message(request: Request, exc: HTTPException) -> str:
    """The message of Litestar's own HTTP error ``exc`` (405 and 413 say what was refused)."""
    if exc.status_code == 405:
        return f"method {request.method} is not allowed on {request.url.path}"
    if exc.status_code == 413:
        return f"request body too large: {exc.detail}"
    return exc.detail or "error"


def _http_error(request: Request, exc: HTTPException) -> Response:
    status = exc.status_code
    message = f"no route {request.method} {request.url.path}" if status == 404 else _http_message(request, exc)
    headers = dict(exc.headers or {})
    return error_response(APIError(status, message, headers=headers))


def _unexpected_message(request: Request, exc: Exception) -> str:
    """Log the unexpected ``exc`` with its traceback; the message the client gets (none there)."""
    logger.opt(exception=exc).error("unhandled error on {} {}", request.method, request.url.path)
    return f"internal server error ({type(exc).__name__})"


def _unexpected(request: Request, exc: Exception) -> Response:
    return error_response(APIError(500, _unexpected_message(request, exc), type="server_error"))


def exception_handlers() -> dict:
    """The handlers to pass to ``Litestar(exception_handlers=...)``."""
    return {APIError: _api_error, RequestError: _request_error, HTTPException: _http_error, Exception: _unexpected}


def shaped_handlers(body: Callable[[int, str], dict[str, Any]]) -> dict:
    """The handlers of :func:`exception_handlers` for another API's error shape (Anthropic's,
    Ollama's): every failure answers JSON ``body(status, message)`` with the same status and
    message (except that an unknown route's 404 keeps Litestar's detail) and the error's headers."""

    def respond(status: int, message: str, headers: dict | None = None) -> Response:
        return Response(body(status, message), status_code=status, headers=headers or {}, media_type="application/json")

    def api_error(_: Request, exc: APIError) -> Response:
        return respond(exc.status, exc.message, exc.headers)

    def request_error(_: Request, exc: RequestError) -> Response:
        return respond(400, str(exc))

    def http_error(request: Request, exc: HTTPException) -> Response:
        return respond(exc.status_code, _http_message(request, exc), dict(exc.headers or {}))

    def unexpected(request: Request, exc: Exception) -> Response:
        return respond(500, _unexpected_message(request, exc))

    return {APIError: api_error, RequestError: request_error, HTTPException: http_error, Exception: unexpected}
