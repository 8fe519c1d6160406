"""``GET /v1/models`` and ``GET /v1/models/{model}``: the one served model, OpenAI-shaped.

Owner: the server.  Invariant: answers even while the model loads (the name is known from the
command line); an unknown model id is a 404 ``model_not_found``.
"""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Request, get
from litestar.params import PathParameter

from metrale_core.server.common import check_model
from metrale_core.server.openapi import documented

__all__ = ["get_model", "list_models"]


def _card(host: Any) -> dict[str, Any]:
    card = {"id": host.config.served_model_name, "object": "model",
            "created": host.config.created, "owned_by": "metrale"}
    if host.served is not None:
        card["max_model_len"] = host.served.engine.max_model_len
    return card


@get("/v1/models", operation_id="listModels", tags=["openai"], sync_to_thread=False,
     operation_class=documented(None, (401, 500)))
def list_models(request: Request) -> dict[str, Any]:
    """List the served model."""
    return {"object": "list", "data": [_card(request.app.state.host)]}


@get("/v1/models/{model:path}", operation_id="retrieveModel", tags=["openai"],
     sync_to_thread=False, operation_class=documented(None, (401, 404, 500)))
def get_model(request: Request, model: Annotated[str, PathParameter()]) -> dict[str, Any]:
    """Describe one model (404 unless it is the served one)."""
    host = request.app.state.host
    check_model(host, model.lstrip("/"))
    return _card(host)
