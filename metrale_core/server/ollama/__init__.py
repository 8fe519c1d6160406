"""The Ollama API (``/api/*``) as a translation layer onto the chat path: ``records`` (request
records), ``options`` and ``translate`` (to the chat request), ``errors`` (Ollama's error shape and
model names), ``route`` (``/api/chat``, ``/api/generate``: NDJSON streams), ``info`` (tags, show,
ps, version, embeddings, and the model-store routes this server does not do)."""

from litestar import Router

from metrale_core.server.auth import api_key_guard
from metrale_core.server.ollama.errors import ollama_handlers
from metrale_core.server.ollama.info import INFO_HANDLERS
from metrale_core.server.ollama.route import chat, generate

__all__ = ["ollama_router"]


def ollama_router() -> Router:
    """The ``/api`` routes with the server's bearer auth and Ollama's error shape."""
    return Router(
        path="/api",
        route_handlers=[chat, generate, *INFO_HANDLERS],
        guards=[api_key_guard],
        exception_handlers=ollama_handlers(),
    )
