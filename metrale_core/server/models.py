"""``GET /v1/models`` and ``GET /v1/models/{model}``: the served model and its LoRA adapters.

Owner: the server.  Invariant: answers even while the model loads (the name is known from the
command line); an unknown model id is a 404 ``model_not_found``; each loaded LoRA adapter is a
model whose ``parent`` is the served model.
"""

from __future__ import annotations

from typing import Annotated, Any

from litestar import get
from litestar.di import NamedDependency
from litestar.params import PathParameter

from metrale_core.server.common import check_model, lora_bank
from metrale_core.server.openapi import documented

__all__ = ["get_model", "list_models"]


def _card(host: Any) -> dict[str, Any]:
    card = {
        "id": host.config.served_model_name,
        "object": "model",
        "created": host.config.created,
        "owned_by": "metrale",
    }
    if host.served is not None:
        card["max_model_len"] = host.served.engine.max_model_len
    return card


def _adapter_card(host: Any, name: str) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": host.config.created,
        "owned_by": "metrale",
        "parent": host.config.served_model_name,
    }


def _adapter_names(host: Any) -> list[str]:
    bank = lora_bank(host)
    return [] if bank is None else bank.names()


@get(
    "/v1/models",
    operation_id="listModels",
    tags=["openai"],
    sync_to_thread=False,
    operation_class=documented(None, (401, 500), ok="ModelList"),
)
def list_models(host: NamedDependency[Any]) -> dict[str, Any]:
    """List the served model and its LoRA adapters."""
    return {"object": "list", "data": [_card(host)] + [_adapter_card(host, n) for n in _adapter_names(host)]}


@get(
    "/v1/models/{model:path}",
    operation_id="retrieveModel",
    tags=["openai"],
    sync_to_thread=False,
    operation_class=documented(None, (401, 404, 500), ok="Model"),
)
def get_model(host: NamedDependency[Any], model: Annotated[str, PathParameter()]) -> dict[str, Any]:
    """Describe one model (404 unless it is the served one)."""
    name = check_model(host, model.lstrip("/"))
    return _card(host) if name == host.config.served_model_name else _adapter_card(host, name)
