"""``create_app``: the Litestar application of ``met serve`` (routes, auth, limits, lifespan).

Owner: ``metrale_core.cli.serve`` builds one and hands it to uvicorn; tests build one around a
tiny model.  The lifespan creates the :class:`EngineHost`, starts loading the model in the
background (``/health`` is 503 until it is ready) and, at exit, drains in-flight requests for
the grace period before stopping the engine thread.

Routes: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses`` (+ ``GET``/``DELETE``
``/v1/responses/{id}``), ``/v1/embeddings``, ``/v1/messages`` (+ ``/count_tokens``, Anthropic
auth and error shape), ``/v1/models``, ``/tokenize``,
``/detokenize``, ``/health``, ``/health/live``, ``/metrics``, the OpenAPI schema under
``/schema``, ``/`` (the browser chat page, outside the API-key guard; ``server.webui``); other
OpenAI routes answer 501.

Invariants:
- Every error body is OpenAI-shaped (``errors.exception_handlers``).
- Request bodies above ``config.max_body_bytes`` are refused with 413 before being buffered.
- One access-log line per request through loguru (method, path, status, duration), and the
  same request counted in ``/metrics`` by route (``metrale:http_requests_total``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from litestar import Litestar, Request, Router, route
from litestar.datastructures import State
from litestar.enums import ScopeType
from litestar.openapi import OpenAPIConfig
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from loguru import logger

from metrale_core.server.auth import api_key_guard
from metrale_core.server.chat import chat_completions
from metrale_core.server.completions import completions
from metrale_core.server.deps import DEPENDENCIES
from metrale_core.server.embeddings import create_embeddings
from metrale_core.server.errors import APIError, exception_handlers
from metrale_core.server.health import health, live
from metrale_core.server.host import EngineHost, ServedModel, ServerConfig
from metrale_core.server.lora_routes import load_lora_adapter, unload_lora_adapter
from metrale_core.server.messages import messages_router
from metrale_core.server.metrics import ServerMetrics, metrics_route
from metrale_core.server.models import get_model, list_models
from metrale_core.server.ollama import ollama_router
from metrale_core.server.responses import ResponseStore, response_handlers
from metrale_core.server.tokenize import detokenize, tokenize
from metrale_core.server.webui import webui_handlers

if TYPE_CHECKING:
    from metrale_core.plugin.registry import Registry

__all__ = ["create_app"]

#: OpenAI routes this server does not implement (answered 501).
UNSUPPORTED = (
    "audio",
    "images",
    "moderations",
    "files",
    "batches",
    "fine_tuning",
    "assistants",
    "threads",
    "vector_stores",
    "uploads",
    "realtime",
    "conversations",
    "evals",
    "containers",
)


@route(
    [f"/v1/{name}" for name in UNSUPPORTED] + [f"/v1/{name}/{{rest:path}}" for name in UNSUPPORTED],
    http_method=["GET", "POST", "PUT", "PATCH", "DELETE"],
    include_in_schema=False,
    sync_to_thread=False,
)
def not_implemented(request: Request) -> None:
    raise APIError(
        501,
        f"{request.method} {request.url.path} is not implemented by this server "
        f"(it serves chat completions, completions, responses, embeddings, "
        f"models, tokenize, and Anthropic messages)",
        code="not_implemented",
    )


def _access_log(app: ASGIApp) -> ASGIApp:
    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 0

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await app(scope, receive, send_wrapper)
        finally:
            client = scope.get("client") or ("-", 0)
            elapsed = time.perf_counter() - start
            logger.info(
                "{} {} {} {} {:.1f}ms", client[0], scope["method"], scope["path"], status or "-", elapsed * 1000
            )
            route = scope.get("path_template")
            metrics = getattr(scope.get("litestar_app"), "state", {}).get("metrics")
            if route and metrics is not None:
                metrics.http_request(route, scope["method"], status or 500, elapsed)

    return middleware


def create_app(
    config: ServerConfig, loader: Callable[[], ServedModel], registry: Registry | None = None, *, openapi: bool = True
) -> Litestar:
    """The server app; ``loader()`` runs on a worker thread at startup and returns the model."""
    host = EngineHost(config=config, registry=registry)
    host.metrics = metrics = ServerMetrics(host, config.served_model_name)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        loading = asyncio.create_task(host.load(loader))
        try:
            yield
        finally:
            if not loading.done():
                host.status = "stopping"
                await asyncio.wait([loading])
            await host.shutdown()

    api = Router(
        path="/",
        guards=[api_key_guard],
        route_handlers=[
            chat_completions,
            completions,
            *response_handlers,
            create_embeddings,
            list_models,
            get_model,
            tokenize,
            detokenize,
            load_lora_adapter,
            unload_lora_adapter,
            not_implemented,
        ],
    )
    return Litestar(
        route_handlers=[api, messages_router(), ollama_router(), *webui_handlers, health, live, metrics_route],
        lifespan=[lifespan],
        exception_handlers=exception_handlers(),
        dependencies=DEPENDENCIES,
        middleware=[_access_log],
        request_max_body_size=config.max_body_bytes,
        state=State({"host": host, "metrics": metrics, "responses": ResponseStore(config.responses_store_size)}),
        openapi_config=OpenAPIConfig(title="Metrale", version="1", path="/schema") if openapi else None,
        debug=False,
    )
