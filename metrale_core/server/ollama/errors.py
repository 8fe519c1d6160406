"""Ollama-shaped errors (``{"error": "message"}``), auth and model names for the ``/api`` routes.

Owner: ``server.ollama`` mounts its handlers on a router with :func:`ollama_handlers` (handler-level
exception handlers, so every failure under ``/api`` -- validation, auth, body size, engine faults
-- answers Ollama's shape) and the server's bearer :func:`~metrale_core.server.auth.api_key_guard`
(Ollama clients send ``Authorization: Bearer <key>`` through their ``headers``).

Invariants:
- The status is the server's own (400 bad input, 401 bad key, 404 unknown model, 503 loading);
  only a genuine server fault is a 5xx.
- An unknown model is Ollama's sentence: ``model "x" not found, try pulling it first``.
- ``name:latest`` names the served model ``name`` (Ollama clients add the default tag).
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException
from loguru import logger

from metrale_core.errors import RequestError
from metrale_core.server.common import check_model
from metrale_core.server.errors import APIError

__all__ = ["model_name", "ollama_error_body", "ollama_handlers", "tagged"]


def ollama_error_body(message: str) -> dict[str, Any]:
    return {"error": message}


def _response(status: int, message: str, headers: dict | None = None) -> Response:
    return Response(
        ollama_error_body(message), status_code=status, headers=headers or {}, media_type="application/json"
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


def ollama_handlers() -> dict:
    return {APIError: _api_error, RequestError: _request_error, HTTPException: _http_error, Exception: _unexpected}


def model_name(host: Any, model: str | None) -> str:
    """The served (or LoRA adapter) name ``model`` means; Ollama's 404 for any other name."""
    if not model:
        raise APIError(400, "model is required")
    for candidate in (model, model.removesuffix(":latest")):
        try:
            return check_model(host, candidate)
        except APIError:
            continue
    raise APIError(404, f'model "{model}" not found, try pulling it first')


def tagged(name: str) -> str:
    """``name`` with Ollama's default tag (what ``/api/tags`` lists)."""
    return name if ":" in name else f"{name}:latest"
