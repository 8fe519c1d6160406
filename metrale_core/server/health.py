"""``GET /health``: readiness (503 while the model loads, after a failed load or while
stopping; 200 when requests can be served) and ``GET /health/live``: liveness (always 200).

Owner: the server; load balancers and the tests poll it.
"""

from __future__ import annotations

from litestar import Request, Response, get

from metrale_core.server.errors import APIError, error_response
from metrale_core.server.openapi import documented

__all__ = ["health", "live"]


@get("/health", tags=["ops"], sync_to_thread=False, operation_class=documented(None, (500, 503)))
def health(request: Request) -> Response:
    """Ready to serve: 200 ``{"status": "ok"}``; otherwise an OpenAI-shaped 503."""
    host = request.app.state.host
    try:
        host.ready()
    except APIError as exc:
        return error_response(exc)
    return Response({"status": "ok", "model": host.config.served_model_name})


@get("/health/live", tags=["ops"], sync_to_thread=False, operation_class=documented(None, (500,)))
def live(request: Request) -> dict[str, str]:
    """The process is up (whether or not the model has loaded)."""
    return {"status": request.app.state.host.status}
