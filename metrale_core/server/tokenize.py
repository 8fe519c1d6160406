"""``POST /tokenize`` and ``POST /detokenize`` (vLLM's shapes) with the served tokenizer.

Owner: the server.  ``/tokenize`` takes a ``prompt`` or chat ``messages`` (rendered with the chat
template exactly as ``/v1/chat/completions`` renders them); ``/detokenize`` takes ``tokens``.
Invariant: token ids outside the vocabulary are a 400, never a crash.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, post

from metrale_core.server.chat_prompt import template_messages
from metrale_core.server.common import check_model, read_request
from metrale_core.server.errors import APIError
from metrale_core.server.openapi import body_operation
from metrale_core.server.schemas import DetokenizeRequest, TokenizeRequest

__all__ = ["detokenize", "tokenize"]


@post("/tokenize", tags=["tokenizer"], status_code=200,
      operation_class=body_operation(TokenizeRequest))
async def tokenize(request: Request) -> dict[str, Any]:
    """Token ids of a prompt or a conversation."""
    host = request.app.state.host
    req = await read_request(request, TokenizeRequest)
    check_model(host, req.model)
    served = host.ready()
    tok = served.tokenizer
    if (req.prompt is None) == (req.messages is None):
        raise APIError(400, "give exactly one of prompt or messages", param="prompt")
    if req.messages is not None:
        text = tok.apply_chat_template(template_messages(req.messages),
                                       add_generation_prompt=req.add_generation_prompt,
                                       **(req.chat_template_kwargs or {}))
        ids = tok.encode(text, add_special_tokens=False)
    else:
        ids = tok.encode(req.prompt, add_special_tokens=req.add_special_tokens)
    return {"tokens": ids, "count": len(ids), "max_model_len": served.engine.max_model_len}


@post("/detokenize", tags=["tokenizer"], status_code=200,
      operation_class=body_operation(DetokenizeRequest))
async def detokenize(request: Request) -> dict[str, Any]:
    """The text of token ids."""
    host = request.app.state.host
    req = await read_request(request, DetokenizeRequest)
    check_model(host, req.model)
    tok = host.ready().tokenizer
    bad = [t for t in req.tokens if not 0 <= t < tok.vocab_size]
    if bad:
        raise APIError(400, f"tokens: id {bad[0]} is outside the vocabulary [0, {tok.vocab_size})",
                       param="tokens")
    return {"prompt": tok.decode(req.tokens)}
