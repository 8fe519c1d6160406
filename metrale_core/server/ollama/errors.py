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

from functools import partial
from typing import Any

from metrale_core.server.common import check_model
from metrale_core.server.deps import body_post
from metrale_core.server.errors import APIError, shaped_handlers

__all__ = ["model_name", "ollama_error_body", "ollama_handlers", "ollama_post", "tagged"]

#: :func:`~metrale_core.server.deps.body_post` for an ``/api`` route with a JSON body: tagged
#: ``ollama``, its errors documented in Ollama's shape (:func:`ollama_handlers` answers them so).
ollama_post = partial(body_post, tag="ollama", errors="ollama")


def ollama_error_body(message: str) -> dict[str, Any]:
    return {"error": message}


def ollama_handlers() -> dict:
    return shaped_handlers(lambda _status, message: ollama_error_body(message))


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
