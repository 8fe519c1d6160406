"""``POST /tokenize`` and ``POST /detokenize`` (vLLM's shapes) with the served tokenizer.

Owner: the server.  ``/tokenize`` takes a ``prompt`` or chat ``messages`` (rendered with the chat
template exactly as ``/v1/chat/completions`` renders them); ``/detokenize`` takes ``tokens``.
Invariant: token ids outside the vocabulary are a 400, never a crash.
"""

from __future__ import annotations

from typing import Any

from litestar.di import NamedDependency

from metrale_core.server.chat_prompt import render_messages, template_messages
from metrale_core.server.deps import body_post
from metrale_core.server.errors import APIError
from metrale_core.server.guards import check_prompt_chars
from metrale_core.server.offload import off_loop
from metrale_core.server.schemas import DetokenizeRequest, TokenizeRequest

__all__ = ["detokenize", "tokenize"]


@body_post("/tokenize", TokenizeRequest, tag="tokenizer", ok="Tokenized")
async def tokenize(
    req: NamedDependency[TokenizeRequest], engine: NamedDependency[Any], tokenizer: NamedDependency[Any]
) -> dict[str, Any]:
    """Token ids of a prompt or a conversation."""
    if (req.prompt is None) == (req.messages is None):
        raise APIError(400, "give exactly one of prompt or messages", param="prompt")
    ids = await off_loop(_tokens, tokenizer, req, engine.max_model_len)
    return {"tokens": ids, "count": len(ids), "max_model_len": engine.max_model_len}


def _tokens(tok: Any, req: TokenizeRequest, max_model_len: int) -> list[int]:
    if req.messages is not None:
        text = render_messages(
            tok,
            template_messages(req.messages),
            tools=None,
            add_generation_prompt=req.add_generation_prompt,
            chat_template_kwargs=req.chat_template_kwargs,
            max_model_len=max_model_len,
        )
        return tok.encode(text, add_special_tokens=False)
    assert req.prompt is not None  # validated: exactly one of prompt / messages
    check_prompt_chars(len(req.prompt), tok, max_model_len, "prompt")
    return tok.encode(req.prompt, add_special_tokens=req.add_special_tokens)


@body_post("/detokenize", DetokenizeRequest, tag="tokenizer", ok="Detokenized")
async def detokenize(req: NamedDependency[DetokenizeRequest], tokenizer: NamedDependency[Any]) -> dict[str, Any]:
    """The text of token ids."""
    tok = tokenizer
    bad = [t for t in req.tokens if not 0 <= t < tok.vocab_size]
    if bad:
        raise APIError(400, f"tokens: id {bad[0]} is outside the vocabulary [0, {tok.vocab_size})", param="tokens")
    return {"prompt": tok.decode(req.tokens)}
