"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` (Anthropic Messages API).

Owner: the server app mounts :func:`messages_router`.  A request is parsed into
``records.MessagesRequest``, translated to the chat request (``translate.to_chat``) and run on
the one chat path (``server.translate``); the pieces come back as Anthropic content blocks.

Streamed events (each with its ``event:`` line, which the ``anthropic`` client requires -- it
silently drops events without one): ``message_start`` (with the real ``input_tokens``), ``ping``,
then per content block ``content_block_start`` / ``content_block_delta`` (``text_delta``,
``thinking_delta``, ``input_json_delta``) / ``content_block_stop``, then ``message_delta``
(``stop_reason``, output usage) and ``message_stop``.  A failure after the first byte is one
``event: error`` with the Anthropic error body.

Invariants:
- Stop reasons: EOS -> ``end_turn``; a stop sequence -> ``stop_sequence`` with the sequence;
  ``max_tokens`` reached -> ``max_tokens``; a tool call made -> ``tool_use``.
- Blocks are opened in output order and never interleave: a change of kind (text, thinking, a
  new tool call) closes the open block first; ``input_json_delta`` fragments concatenate to the
  call's ``input`` JSON.
- Every error is Anthropic-shaped (``messages.errors``); bad input is a 4xx naming the field.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from litestar import Response, Router
from litestar.di import NamedDependency
from litestar.response import Stream
from loguru import logger

from metrale_core.server.chat import engine_failure
from metrale_core.server.chat_prompt import chat_prompt
from metrale_core.server.common import new_id
from metrale_core.server.errors import APIError
from metrale_core.server.messages.errors import (
    anthropic_error_body,
    anthropic_handlers,
    anthropic_key_guard,
    anthropic_post,
)
from metrale_core.server.messages.records import CountTokensRequest, MessagesRequest
from metrale_core.server.messages.translate import to_chat
from metrale_core.server.offload import off_loop
from metrale_core.server.translate import ChatRun, call_arguments, pieces, renamed, start_chat

__all__ = ["messages_router"]


def _stop(run: ChatRun, served: Any, stops: list[str], raw_text: str, token_ids: list[int]) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)`` of a finished run."""
    reason = run.finish_reason
    if reason == "length":
        return "max_tokens", None
    if run.calls:
        return "tool_use", None
    if stops and token_ids:
        engine = served.engine
        eos = set(engine.output_processor.eos_token_ids)
        if token_ids[-1] not in eos:
            full = served.tokenizer.decode(token_ids, skip_special_tokens=True)
            tail = full[len(raw_text) :] if full.startswith(raw_text) else full
            for s in stops:
                if tail.startswith(s):
                    return "stop_sequence", s
            found = [(tail.find(s), s) for s in stops if s in tail]
            if found:
                return "stop_sequence", min(found)[1]
    return "end_turn", None


async def _start(host: Any, req: MessagesRequest) -> ChatRun:
    chat = to_chat(req)
    try:
        run = await start_chat(host, chat, max_tokens=req.max_tokens, budget_field="thinking.budget_tokens")
    except APIError as exc:  # name the Messages field for what chat knows as response_format
        raise renamed(exc, "response_format", "output_config.format") from None
    return run


@anthropic_post(
    "/v1/messages",
    MessagesRequest,
    ok="Message",
    stream=True,
    operation_id="createMessage",
    summary="Create a message (Anthropic Messages API)",
)
async def create_message(
    host: NamedDependency[Any], req: NamedDependency[MessagesRequest], model_name: NamedDependency[str]
) -> Response | Stream:
    run = await _start(host, req)
    message_id = new_id("msg")
    if req.stream:
        return Stream(
            _sse(_stream(host, req, run, model_name, message_id)),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    blocks: list[dict] = []
    raw, ids = [], []
    async for out in run.outputs():
        raw.append(out.text_delta)
        ids += out.new_token_ids
        for p in pieces(run, out):
            last = blocks[-1] if blocks else None
            if p.kind in ("text", "reasoning"):
                kind, key = ("text", "text") if p.kind == "text" else ("thinking", "thinking")
                if last is None or last["type"] != kind:
                    last = {"type": kind, key: ""}
                    if kind == "thinking":
                        last["signature"] = ""
                    blocks.append(last)
                last[key] += p.text
            elif p.kind == "call":
                blocks.append({"type": "tool_use", "id": p.call_id, "name": p.name, "input": {}})
        if out.finished and (failure := engine_failure(out)) is not None:
            raise failure
    for block in blocks:
        if block["type"] == "tool_use":
            block["input"] = call_arguments(next(c["arguments"] for c in run.calls.values() if c["id"] == block["id"]))
    stop_reason, stop_sequence = _stop(run, host.served, req.stop_sequences or [], "".join(raw), ids)
    body = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model_name,
        "content": blocks,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": {"input_tokens": run.prompt_tokens, "output_tokens": run.output_tokens},
    }
    return Response(body, media_type="application/json")


async def _stream(
    host: Any, req: MessagesRequest, run: ChatRun, name: str, message_id: str
) -> AsyncIterator[tuple[str, dict]]:
    yield (
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "model": name,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": run.prompt_tokens, "output_tokens": 0},
            },
        },
    )
    yield "ping", {"type": "ping"}
    index, open_kind, open_call = -1, None, None
    raw, ids = [], []

    def stop_block() -> tuple[str, dict]:
        return "content_block_stop", {"type": "content_block_stop", "index": index}

    async for out in run.outputs():
        raw.append(out.text_delta)
        ids += out.new_token_ids
        for p in pieces(run, out):
            if p.kind in ("text", "reasoning"):
                kind = "text" if p.kind == "text" else "thinking"
                if open_kind != kind:
                    if open_kind is not None:
                        yield stop_block()
                    index, open_kind, open_call = index + 1, kind, None
                    block = (
                        {"type": "text", "text": ""}
                        if kind == "text"
                        else {"type": "thinking", "thinking": "", "signature": ""}
                    )
                    yield "content_block_start", {"type": "content_block_start", "index": index, "content_block": block}
                delta = (
                    {"type": "text_delta", "text": p.text}
                    if kind == "text"
                    else {"type": "thinking_delta", "thinking": p.text}
                )
                yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
            elif p.kind == "call":
                if open_kind is not None:
                    yield stop_block()
                index, open_kind, open_call = index + 1, "tool_use", p.index
                yield (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "tool_use", "id": p.call_id, "name": p.name, "input": {}},
                    },
                )
            elif p.kind == "args" and open_call == p.index:
                yield (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": p.text},
                    },
                )
        if out.finished and (failure := engine_failure(out)) is not None:
            raise failure
    if open_kind is not None:
        yield stop_block()
    stop_reason, stop_sequence = _stop(run, host.served, req.stop_sequences or [], "".join(raw), ids)
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": {"output_tokens": run.output_tokens},
        },
    )
    yield "message_stop", {"type": "message_stop"}


def _event(name: str, payload: dict) -> bytes:
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"event: {name}\ndata: {data}\n\n".encode()


async def _sse(events: AsyncIterator[tuple[str, dict]]) -> AsyncIterator[bytes]:
    try:
        async for name, payload in events:
            yield _event(name, payload)
    except APIError as exc:
        yield _event("error", anthropic_error_body(exc.status, exc.message))
    except Exception as exc:
        logger.opt(exception=exc).error("messages stream failed")
        yield _event("error", anthropic_error_body(500, f"internal server error ({type(exc).__name__})"))


@anthropic_post(
    "/v1/messages/count_tokens",
    CountTokensRequest,
    ok="MessageTokensCount",
    operation_id="countMessageTokens",
    summary="Count the input tokens of a Messages request",
)
async def count_tokens(
    req: NamedDependency[CountTokensRequest], engine: NamedDependency[Any], tokenizer: NamedDependency[Any]
) -> Response:
    try:
        prompt, _ = await off_loop(chat_prompt, tokenizer, to_chat(req), engine.max_model_len)
    except APIError as exc:
        raise renamed(exc, "response_format", "output_config.format") from None
    return Response({"input_tokens": len(prompt)}, media_type="application/json")


def messages_router() -> Router:
    """The Messages routes with Anthropic auth and error shape (one router per app)."""
    return Router(
        path="/",
        route_handlers=[create_message, count_tokens],
        guards=[anthropic_key_guard],
        exception_handlers=anthropic_handlers(),
    )
