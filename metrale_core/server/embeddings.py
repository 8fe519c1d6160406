"""``POST /v1/embeddings`` (OpenAI): pooled, L2-normalised last hidden states.

Owner: the server.  Each input becomes one prefill-only engine request
(``extras={"pooling": Pooling(mode)}``, see ``metrale_core.engine.pooling``) that goes through the
same scheduler as generation (same queue, batched in the same forwards) and finishes as soon as
its prompt is consumed, keeping no KV; its final delta carries the vector.

Request: ``input`` a string, an array of strings, an array of token ids or an array of arrays of
token ids; ``encoding_format`` ``float`` (default) or ``base64`` (little-endian float32, what the
``openai`` client sends by default and decodes); ``dimensions`` is refused (400) because the
vectors are not truncatable; ``user`` is accepted.

Invariants:
- Pooling is ``--pooling`` when given, else the model's declared default (``default_pooling``),
  else ``mean``.
- ``usage.prompt_tokens`` = ``usage.total_tokens`` = the tokens of all inputs.
- A model that cannot return hidden states is a 400, checked before any work; every input is
  validated before the first engine request is added.
"""

from __future__ import annotations

import base64
from typing import Any

from litestar import Request, Response, post

from metrale_core.engine.pooling import can_pool, default_pooling
from metrale_core.server.chat import engine_failure
from metrale_core.server.common import check_model, read_request
from metrale_core.server.errors import APIError
from metrale_core.server.generation import plan_embeddings
from metrale_core.server.openapi import body_operation
from metrale_core.server.schemas import EmbeddingRequest

__all__ = ["create_embeddings", "embed"]


def _inputs(tokenizer: Any, value: Any) -> list[list[int]]:
    """Each input as token ids (strings are tokenized with the model's special tokens)."""
    if isinstance(value, str) or (value and isinstance(value[0], int)):
        value = [value]
    out = []
    for i, item in enumerate(value):
        ids = tokenizer.encode(item, add_special_tokens=True) if isinstance(item, str) else item
        if not ids:
            raise APIError(400, f"input[{i}]: must not be empty", param=f"input[{i}]")
        out.append(list(ids))
    return out


def _encode(vector: Any, fmt: str) -> Any:
    if fmt == "base64":
        return base64.b64encode(vector.numpy().astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


async def embed(host: Any, name: str, value: Any) -> tuple[list[Any], int]:
    """The pooled vectors of ``value`` (what ``input`` may be) in input order, and the tokens
    they took; 400 before any work when the model cannot pool or an input is invalid."""
    served = host.ready()
    engine = served.engine
    if not can_pool(engine.model):
        raise APIError(
            400, f"model: {name!r} cannot produce embeddings (its model has no hidden-state output)", param="model"
        )
    mode = host.config.pooling or default_pooling(engine.model)
    prompts = _inputs(served.tokenizer, value)
    host.check_capacity(len(prompts))
    run = plan_embeddings(host, prompts, mode)
    vectors: dict[int, Any] = {}
    async for index, out in run.stream:
        if out.finished:
            if (failure := engine_failure(out)) is not None:
                raise failure
            if out.embedding is None:
                raise APIError(500, "the engine finished an embedding request without a vector", type="server_error")
            vectors[index] = out.embedding
    return [vectors[i] for i in range(len(prompts))], sum(len(p) for p in prompts)


@post(
    "/v1/embeddings",
    operation_id="createEmbedding",
    tags=["openai"],
    status_code=200,
    summary="Create embeddings (OpenAI-compatible)",
    operation_class=body_operation(EmbeddingRequest, ok="EmbeddingList"),
)
async def create_embeddings(request: Request) -> Response:
    host = request.app.state.host
    req = await read_request(request, EmbeddingRequest)
    name = check_model(host, req.model)
    host.ready()
    if req.encoding_format not in ("float", "base64"):
        raise APIError(
            400, f"encoding_format: must be 'float' or 'base64', got {req.encoding_format!r}", param="encoding_format"
        )
    if req.dimensions is not None:
        raise APIError(
            400,
            "dimensions: not supported; this model's embeddings have a fixed size and cannot be shortened",
            param="dimensions",
        )
    vectors, tokens = await embed(host, name, req.input)
    data = [
        {"object": "embedding", "index": i, "embedding": _encode(vector, req.encoding_format)}
        for i, vector in enumerate(vectors)
    ]
    return Response(
        {"object": "list", "data": data, "model": name, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}},
        media_type="application/json",
    )
