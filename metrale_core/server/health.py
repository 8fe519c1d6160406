"""``GET /health``: readiness (503 while the model loads, after a failed load, while
stopping or while a data-parallel replica is down; 200 when requests can be served, with
``replicas`` under data parallel) and ``GET /health/live``: liveness (always 200).

Owner: the server; load balancers and the tests poll it.
"""

from __future__ import annotations

from typing import Any

from litestar import Response, get
from litestar.di import NamedDependency

from metrale_core.server.errors import APIError, error_response
from metrale_core.server.openapi import documented

__all__ = ["health", "live"]


@get("/health", tags=["ops"], sync_to_thread=False, operation_class=documented(None, (500, 503), ok="Health"))
def health(host: NamedDependency[Any]) -> Response:
    """Ready to serve: 200 ``{"status": "ok"}``; otherwise an OpenAI-shaped 503."""
    try:
        host.ready()
    except APIError as exc:
        return error_response(exc)
    body = {"status": "ok", "model": host.config.served_model_name}
    if host.replicated:  # data parallel: 503 while a replica is down (the others serve)
        body["replicas"] = host.async_engine.replica_status()
        down = host.async_engine.replicas_down
        if down:
            return error_response(
                APIError(
                    503,
                    f"data-parallel replica(s) {', '.join(map(str, down))} down and restarting "
                    f"(a remote one: until it connects again); requests are served by the others",
                    code="replica_down",
                    headers={"Retry-After": "1"},
                )
            )
    return Response(body)


@get("/health/live", tags=["ops"], sync_to_thread=False, operation_class=documented(None, (500,), ok="Liveness"))
def live(host: NamedDependency[Any]) -> dict[str, str]:
    """The process is up (whether or not the model has loaded)."""
    return {"status": host.status}
