"""``POST /api/chat`` and ``POST /api/generate`` (Ollama's API) on the one chat path.

Owner: ``server.ollama`` mounts these.  A body is parsed into ``records``, translated to the chat
request (``translate``) and run by ``server.translate.start_chat``; its pieces come back as
Ollama's replies.

Replies: with ``stream`` (Ollama's default) one JSON object per line
(``application/x-ndjson``): ``{"model", "created_at", "message": {"role": "assistant",
"content", "thinking"?}, "done": false}`` per delta (generate: ``response`` / ``thinking``
instead of ``message``), then the tool calls (if any) in one line, then the final line with
``"done": true``, ``done_reason`` and the counts and durations (nanoseconds) Ollama reports.
Without ``stream``, one object: the final line with the whole message.

Invariants:
- ``done_reason``: ``stop`` (EOS, a stop string or a tool call), ``length`` (``num_predict`` or
  the context); an empty ``messages`` (chat) or ``prompt`` (generate) answers at once with
  ``done_reason: "load"`` (Ollama's way to load a model), running nothing.
- Tool calls carry their ``arguments`` as an object (Ollama's shape), parsed from the call's
  JSON; every call has the name the model gave.
- Every rejection happens before the first byte (a clean 4xx); a failure after it is one
  ``{"error": ...}`` line and the stream ends.  A client that disconnects aborts its request.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from typing import Any

from attrs import define, field
from litestar import Request, Response
from litestar.di import NamedDependency
from litestar.response import Stream
from loguru import logger

from metrale_core.server.chat import engine_failure
from metrale_core.server.common import while_connected
from metrale_core.server.errors import APIError
from metrale_core.server.ollama.errors import model_name, ollama_error_body, ollama_post
from metrale_core.server.ollama.records import OllamaChatRequest, OllamaGenerateRequest
from metrale_core.server.ollama.translate import chat_request, generate_request
from metrale_core.server.translate import ChatRun, call_arguments, pieces, renamed, start_chat

__all__ = ["NDJSON", "chat", "generate", "now_rfc3339"]

NDJSON = "application/x-ndjson"


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


@define
class _Reply:
    """One request's reply being built: the shape (chat or generate) and its timings."""

    name: str
    chat: bool
    started: float = field(factory=time.perf_counter)
    first_token: float | None = None

    def line(self, text: str = "", thinking: str = "", calls: list[dict] | None = None) -> dict:
        body: dict[str, Any] = {"model": self.name, "created_at": now_rfc3339()}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            body["message"] = message
        else:
            body["response"] = text
            if thinking:
                body["thinking"] = thinking
        body["done"] = False
        return body

    def final(self, run: ChatRun | None, **content: Any) -> dict:
        body = self.line(**content)
        if run is None:
            body.update(done=True, done_reason="load")
            return body
        end = time.perf_counter()
        first = self.first_token or end
        body.update(
            done=True,
            done_reason="length" if run.finish_reason == "length" else "stop",
            total_duration=int((end - self.started) * 1e9),
            load_duration=0,
            prompt_eval_count=run.prompt_tokens,
            prompt_eval_duration=int((first - self.started) * 1e9),
            eval_count=run.output_tokens,
            eval_duration=int((end - first) * 1e9),
        )
        return body


def _calls(run: ChatRun) -> list[dict]:
    return [
        {"function": {"index": i, "name": call["name"], "arguments": call_arguments(call["arguments"])}}
        for i, call in sorted(run.calls.items())
    ]


async def _deltas(reply: _Reply, run: ChatRun) -> AsyncIterator[tuple[str, str]]:
    """``(text, thinking)`` per engine delta that has either; raises the engine's failure."""
    async for out in run.outputs():
        if reply.first_token is None and out.new_token_ids:
            reply.first_token = time.perf_counter()
        text, thinking = [], []
        for p in pieces(run, out):
            if p.kind == "text":
                text.append(p.text)
            elif p.kind == "reasoning":
                thinking.append(p.text)
        if text or thinking:
            yield "".join(text), "".join(thinking)
        if out.finished and (failure := engine_failure(out)) is not None:
            raise failure


def encode(body: dict) -> bytes:
    """One NDJSON line."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


async def _lines(reply: _Reply, run: ChatRun) -> AsyncIterator[bytes]:
    try:
        async for text, thinking in _deltas(reply, run):
            yield encode(reply.line(text, thinking))
        if run.calls:
            yield encode(reply.line(calls=_calls(run)))
        yield encode(reply.final(run))
    except APIError as exc:
        yield encode(ollama_error_body(exc.message))
    except Exception as exc:
        logger.opt(exception=exc).error("ollama stream failed")
        yield encode(ollama_error_body(f"internal server error ({type(exc).__name__})"))


async def _whole(reply: _Reply, run: ChatRun) -> dict:
    texts, thoughts = [], []
    async for text, thinking in _deltas(reply, run):
        texts.append(text)
        thoughts.append(thinking)
    return reply.final(run, text="".join(texts), thinking="".join(thoughts), calls=_calls(run) or None)


async def _answer(
    request: Request, host: Any, req: Any, chat: Any, *, is_chat: bool, empty: bool, raw_prompt: str | None = None
) -> Response | Stream:
    """Run the translated ``chat`` of ``req`` (after checking the model is ready), or answer that
    the model is loaded when the request is ``empty`` (Ollama's way to load a model)."""
    reply = _Reply(name=req.model, chat=is_chat)
    host.ready()
    if empty:
        return _loaded(reply, req.stream)
    try:
        run = await start_chat(host, chat, max_tokens=chat.max_tokens, raw_prompt=raw_prompt)
    except APIError as exc:  # name Ollama's fields for what chat calls them
        raise renamed(renamed(exc, "response_format", "format"), "max_tokens", "options.num_predict") from None
    if req.stream:
        return Stream(_lines(reply, run), media_type=NDJSON, headers={"Cache-Control": "no-cache"})
    return Response(await while_connected(request, _whole(reply, run)), media_type="application/json")


def _loaded(reply: _Reply, stream: bool) -> Response:
    """Ollama's answer to a request with nothing to run: the model is loaded."""
    if stream:
        return Response(encode(reply.final(None)), media_type=NDJSON)
    return Response(reply.final(None), media_type="application/json")


@ollama_post(
    "/chat", OllamaChatRequest, ok="OllamaChat", stream=True, operation_id="ollamaChat", summary="Chat (Ollama API)"
)
async def chat(
    request: Request, host: NamedDependency[Any], req: NamedDependency[OllamaChatRequest]
) -> Response | Stream:
    translated = chat_request(req, model_name(host, req.model))
    return await _answer(request, host, req, translated, is_chat=True, empty=not req.messages)


@ollama_post(
    "/generate",
    OllamaGenerateRequest,
    ok="OllamaGenerate",
    stream=True,
    operation_id="ollamaGenerate",
    summary="Generate a completion (Ollama API)",
)
async def generate(
    request: Request, host: NamedDependency[Any], req: NamedDependency[OllamaGenerateRequest]
) -> Response | Stream:
    translated = generate_request(req, model_name(host, req.model))
    raw_prompt = req.prompt if req.raw else None
    return await _answer(request, host, req, translated, is_chat=False, empty=not req.prompt, raw_prompt=raw_prompt)
