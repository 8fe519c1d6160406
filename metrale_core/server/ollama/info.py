"""Ollama's model and embedding routes: ``/api/tags``, ``/api/show``, ``/api/ps``,
``/api/version``, ``/api/embed``, ``/api/embeddings``, and the model-management routes this
server does not do.

Owner: ``server.ollama`` mounts these.

Invariants:
- The served model (and each loaded LoRA adapter) is listed as ``name:latest``; ``/api/show`` and
  the embedding routes take a name with or without the tag, and answer Ollama's 404 for any other.
- ``size`` is the bytes of the served model's tensors in memory; ``digest`` is stable for one
  server process (derived from the name and start time: there is no Ollama blob store here).
- ``/api/embed`` vectors are the ones ``/v1/embeddings`` returns (the same pooling, one engine
  request per input, L2-normalised, as Ollama's are).
- ``/api/pull`` of the served name succeeds at once (it is here), any other is a 404; ``push`` /
  ``create`` / ``copy`` / ``delete`` are a 403: each says how to serve another model instead.
- ``/api/version`` reports the Ollama API level these routes follow (:data:`OLLAMA_API_VERSION`),
  so clients that gate features on it (``think``, ``tools``) use them; ``metrale`` has ours.
"""

from __future__ import annotations

import hashlib
import time
from datetime import datetime, timezone
from typing import Any

from litestar import Request, Response, delete, get, post
from litestar.di import NamedDependency

from metrale_core import __version__
from metrale_core.engine.pooling import can_pool
from metrale_core.server.chat_prompt import reasoning_format
from metrale_core.server.common import lora_bank
from metrale_core.server.embeddings import embed
from metrale_core.server.errors import APIError
from metrale_core.server.ollama.errors import model_name, ollama_post, tagged
from metrale_core.server.ollama.records import (
    OllamaEmbeddingsRequest,
    OllamaEmbedRequest,
    OllamaModelRequest,
    OllamaPullRequest,
)
from metrale_core.server.openapi import documented

__all__ = ["INFO_HANDLERS", "OLLAMA_API_VERSION"]

#: The Ollama release whose API these routes follow.
OLLAMA_API_VERSION = "0.12.0"
_FAR_FUTURE = "2318-01-01T00:00:00Z"


def _started(host: Any) -> str:
    return datetime.fromtimestamp(host.config.created, timezone.utc).isoformat().replace("+00:00", "Z")


def _tensor_bytes(root: Any, limit: int = 200_000) -> int:
    """Bytes of the distinct tensor storages reachable from ``root``'s attributes, lists and dicts
    (the model's weights, whatever layer objects hold them); at most ``limit`` objects are walked."""
    import torch

    seen: set[int] = set()
    storages: dict[int, int] = {}
    stack = [root]
    while stack and len(seen) < limit:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool, type(None))):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            stack.extend(vars(obj).values())
    return sum(storages.values())


_SIZES: dict[int, int] = {}


def _size(host: Any) -> int:
    """The served model's weight bytes (computed once per loaded engine)."""
    engine = getattr(host.served, "engine", None)
    if engine is None:
        return 0
    if id(engine) not in _SIZES:
        _SIZES.clear()
        _SIZES[id(engine)] = _tensor_bytes(getattr(engine, "model", None))
    return _SIZES[id(engine)]


def _details(host: Any) -> dict[str, Any]:
    family = (host.served.model_type if host.served is not None else None) or "unknown"
    return {
        "parent_model": "",
        "format": "metrale",
        "family": family,
        "families": [family],
        "parameter_size": "",
        "quantization_level": "",
    }


def _entry(host: Any, name: str) -> dict[str, Any]:
    digest = hashlib.sha256(f"{name}@{host.config.created}".encode()).hexdigest()
    return {
        "name": tagged(name),
        "model": tagged(name),
        "modified_at": _started(host),
        "size": _size(host),
        "digest": digest,
        "details": _details(host),
    }


def _names(host: Any) -> list[str]:
    bank = lora_bank(host)
    return [host.config.served_model_name, *([] if bank is None else bank.names())]


def _get(path: str, name: str) -> get:
    """A GET route without a body answering the documented body ``Ollama<name>`` (its operation
    ``ollama<name>``); only the key guard (401) or a fault (500) answer otherwise."""
    return get(
        path,
        operation_id=f"ollama{name}",
        tags=["ollama"],
        operation_class=documented(None, (401, 500), errors="ollama", ok=f"Ollama{name}"),
    )


@_get("/tags", "Tags")
async def list_tags(host: NamedDependency[Any]) -> dict[str, Any]:
    """The served model and its LoRA adapters (answers while the model loads)."""
    return {"models": [_entry(host, n) for n in _names(host)]}


@_get("/ps", "Ps")
async def list_running(host: NamedDependency[Any]) -> dict[str, Any]:
    """The loaded models (none while loading); they stay loaded (``keep_alive`` changes nothing)."""
    if host.served is None:
        return {"models": []}
    ctx = host.served.engine.max_model_len
    return {
        "models": [
            {**_entry(host, n), "expires_at": _FAR_FUTURE, "size_vram": 0, "context_length": ctx} for n in _names(host)
        ]
    }


@_get("/version", "Version")
async def version(request: Request) -> dict[str, str]:
    """The Ollama API level served, and Metrale's version."""
    return {"version": OLLAMA_API_VERSION, "metrale": __version__}


def _capabilities(host: Any) -> list[str]:
    served = host.served
    caps = ["completion"]
    template = served.tokenizer.chat_template or ""
    if "tools" in template:
        caps.append("tools")
    if reasoning_format(host) is not None:
        caps.append("thinking")
    if can_pool(served.engine.model):
        caps.append("embedding")
    return caps


@ollama_post("/show", OllamaModelRequest, ok="OllamaShow", operation_id="ollamaShow")
async def show(host: NamedDependency[Any], req: NamedDependency[OllamaModelRequest]) -> dict[str, Any]:
    """The model's details, chat template, context length and capabilities."""
    model_name(host, req.model or req.name)
    served = host.ready()
    family = _details(host)["family"]
    return {
        "modified_at": _started(host),
        "template": served.tokenizer.chat_template or "",
        "modelfile": "",
        "license": "",
        "parameters": "",
        "details": _details(host),
        "model_info": {
            "general.architecture": family,
            f"{family}.context_length": served.engine.max_model_len,
            "general.file_type": "metrale",
        },
        "capabilities": _capabilities(host),
    }


def _load_fields(name: str, prompt_tokens: int, started: float) -> dict[str, Any]:
    return {
        "model": name,
        "total_duration": int((time.perf_counter() - started) * 1e9),
        "load_duration": 0,
        "prompt_eval_count": prompt_tokens,
    }


@ollama_post("/embed", OllamaEmbedRequest, ok="OllamaEmbed", operation_id="ollamaEmbed")
async def create_embed(host: NamedDependency[Any], req: NamedDependency[OllamaEmbedRequest]) -> dict[str, Any]:
    """Embeddings of one or more inputs (``embeddings``: one vector per input)."""
    started = time.perf_counter()
    name = model_name(host, req.model)
    if req.input is None or req.input == []:
        raise APIError(400, "input: required (a string or an array of strings)", param="input")
    if req.dimensions is not None:
        raise APIError(400, "dimensions: not supported; this model's embeddings have a fixed size", param="dimensions")
    vectors, tokens = await embed(host, name, req.input)
    return {"embeddings": [v.tolist() for v in vectors], **_load_fields(req.model, tokens, started)}


@ollama_post("/embeddings", OllamaEmbeddingsRequest, ok="OllamaEmbeddings", operation_id="ollamaEmbeddings")
async def create_embeddings_legacy(
    host: NamedDependency[Any], req: NamedDependency[OllamaEmbeddingsRequest]
) -> dict[str, Any]:
    """The legacy one-prompt embedding route."""
    name = model_name(host, req.model)
    if not req.prompt:
        return {"embedding": []}  # Ollama answers an empty prompt with an empty vector
    vectors, _ = await embed(host, name, req.prompt)
    return {"embedding": vectors[0].tolist()}


_NO_STORE = (
    "this server serves one model ({}) and keeps no Ollama model store; to serve another, "
    "restart it with `met serve ORG/NAME` (`met pull` fetches one)"
)


@ollama_post("/pull", OllamaPullRequest, ok="OllamaStatus", operation_id="ollamaPull")
async def pull(host: NamedDependency[Any], req: NamedDependency[OllamaPullRequest]) -> Response:
    """The served model is already here: success; any other name: 404."""
    wanted = req.model or req.name
    try:
        model_name(host, wanted)
    except APIError:
        raise APIError(404, f"pull {wanted!r}: " + _NO_STORE.format(repr(host.config.served_model_name))) from None
    return Response({"status": "success"}, media_type="application/json")


def _unsupported(action: str):
    async def handler(host: NamedDependency[Any]) -> Response:
        raise APIError(403, f"{action}: " + _NO_STORE.format(repr(host.config.served_model_name)))

    handler.__name__ = f"ollama_{action}"
    return handler


_NOT_HERE = (401, 403, 500)  # the key guard; the refusal; a fault

INFO_HANDLERS = [
    list_tags,
    list_running,
    version,
    show,
    create_embed,
    create_embeddings_legacy,
    pull,
    *(
        post(
            f"/{action}",
            operation_id=f"ollama{action.title()}",
            tags=["ollama"],
            status_code=200,
            operation_class=documented(None, _NOT_HERE, errors="ollama"),
        )(_unsupported(action))
        for action in ("push", "create", "copy")
    ),
    delete(
        "/delete",
        operation_id="ollamaDelete",
        tags=["ollama"],
        status_code=200,
        operation_class=documented(None, _NOT_HERE, errors="ollama"),
    )(_unsupported("delete")),
]
