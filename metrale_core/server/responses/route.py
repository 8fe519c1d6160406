"""``POST /v1/responses``, ``GET /v1/responses/{id}``, ``DELETE /v1/responses/{id}`` (OpenAI).

Owner: the server app mounts :data:`response_handlers` on its API router.  A request is parsed into
``records.ResponsesRequest``, translated to the chat request (``translate.to_chat``, which also
continues a stored conversation for ``previous_response_id``) and run on the one chat path
(``server.translate``); ``events.OutputBuilder`` turns its pieces into output items.

Streamed: ``response.created`` -> ``response.in_progress`` -> the item events of
``events.OutputBuilder`` -> ``response.completed`` (or ``response.incomplete`` when
``max_output_tokens`` cut it), each with its ``event:`` line and a ``sequence_number`` counting
from 0.  An engine failure after the first byte (the step raised, or the server is shutting down)
closes the open items and ends with ``response.failed`` (``status: "failed"``, ``error: {code,
message}``), as OpenAI's stream does; any other failure after the first byte is one ``error`` event
(``{"type": "error", "code", "message", "param"}``).

Invariants:
- Errors are OpenAI-shaped (the app's handlers); bad input is a 4xx naming the field; an unknown
  ``previous_response_id`` is a 404 naming it.
- With ``store`` (the default) the finished response and its conversation go to the app's
  ``ResponseStore`` (bounded LRU, ``--responses-store-size``), whole or streamed.
- ``usage``: ``input_tokens`` of the rendered prompt, ``output_tokens`` every generated token,
  ``reasoning_tokens`` the tokens of the reasoning items' text (re-encoded with the model's
  tokenizer, so the think tags are not counted), never more than ``output_tokens``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from litestar import Request, Response, delete, get
from litestar.di import NamedDependency
from litestar.params import PathParameter
from litestar.response import Stream
from loguru import logger

from metrale_core.errors import MetraleError
from metrale_core.server.chat import engine_failure
from metrale_core.server.common import new_id
from metrale_core.server.deps import body_post
from metrale_core.server.errors import APIError
from metrale_core.server.openapi import documented
from metrale_core.server.responses.events import OutputBuilder
from metrale_core.server.responses.records import ResponsesRequest
from metrale_core.server.responses.store import ResponseStore, StoredResponse
from metrale_core.server.responses.translate import output_messages, to_chat
from metrale_core.server.translate import ChatRun, pieces, renamed, start_chat

__all__ = ["response_handlers"]


def _store(request: Request) -> ResponseStore:
    return request.app.state.responses


def _reasoning_tokens(run: ChatRun, items: list[dict]) -> int:
    text = "".join(part["text"] for item in items if item["type"] == "reasoning" for part in item["content"])
    if not text:
        return 0
    return min(run.output_tokens, len(run.host.ready().tokenizer.encode(text, add_special_tokens=False)))


def _body(
    req: ResponsesRequest,
    meta: dict,
    status: str,
    items: list[dict],
    run: ChatRun | None,
    error: APIError | None = None,
) -> dict[str, Any]:
    tools = [
        {
            "type": "function",
            "name": t["name"],
            "description": t.get("description"),
            "parameters": t.get("parameters"),
            "strict": t.get("strict", True),
        }
        for t in req.tools or ()
    ]
    usage = None
    if run is not None and status != "in_progress":
        usage = {
            "input_tokens": run.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": run.output_tokens,
            "output_tokens_details": {"reasoning_tokens": _reasoning_tokens(run, items)},
            "total_tokens": run.prompt_tokens + run.output_tokens,
        }
    return {
        **meta,
        "object": "response",
        "status": status,
        "error": None if error is None else {"code": error.code or error.type, "message": error.message},
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "output": items,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": (req.reasoning or {}).get("effort"), "summary": None},
        "store": req.store,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "text": req.text or {"format": {"type": "text"}},
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
        "tools": tools,
        "truncation": req.truncation or "disabled",
        "usage": usage,
        "metadata": req.metadata or {},
        "user": req.user,
    }


def _status(run: ChatRun) -> str:
    return "incomplete" if run.finish_reason == "length" else "completed"


def _remember(request: Request, req: ResponsesRequest, body: dict, conversation: list) -> None:
    if req.store:
        _store(request).put(
            body["id"], StoredResponse(body=body, messages=tuple(conversation + output_messages(body["output"])))
        )


async def _start(request: Request, host: Any, req: ResponsesRequest) -> tuple[ChatRun, list]:
    history: tuple = ()
    if req.previous_response_id is not None:
        stored = _store(request).get(req.previous_response_id)
        if stored is None:
            raise APIError(
                404,
                f"previous_response_id: no stored response "
                f"{req.previous_response_id!r} (responses live in memory, "
                f"bounded by --responses-store-size)",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        history = stored.messages
    chat, conversation = to_chat(req, history)
    try:
        run = await start_chat(host, chat, max_tokens=req.max_output_tokens)
    except APIError as exc:  # name the Responses field for what chat knows as response_format
        raise renamed(exc, "response_format", "text.format") from None
    return run, conversation


@body_post(
    "/v1/responses",
    ResponsesRequest,
    tag="openai",
    ok="ResponseObject",
    stream=True,
    operation_id="createResponse",
    summary="Create a model response (OpenAI Responses API)",
)
async def create_response(
    request: Request,
    host: NamedDependency[Any],
    req: NamedDependency[ResponsesRequest],
    model_name: NamedDependency[str],
) -> Response | Stream:
    run, conversation = await _start(request, host, req)
    meta = {"id": new_id("resp").replace("-", "_"), "created_at": int(time.time()), "model": model_name}
    if req.stream:
        return Stream(
            _sse(_stream(request, req, run, conversation, meta)),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    builder = OutputBuilder()
    async for out in run.outputs():
        for p in pieces(run, out):
            builder.feed(p)
        if out.finished and (failure := engine_failure(out)) is not None:
            raise failure
    builder.finish()
    body = _body(req, meta, _status(run), builder.items, run)
    _remember(request, req, body, conversation)
    return Response(body, media_type="application/json")


async def _stream(
    request: Request, req: ResponsesRequest, run: ChatRun, conversation: list, meta: dict
) -> AsyncIterator[dict]:
    yield {"type": "response.created", "response": _body(req, meta, "in_progress", [], run)}
    yield {"type": "response.in_progress", "response": _body(req, meta, "in_progress", [], run)}
    builder = OutputBuilder()
    async for out in run.outputs():
        for p in pieces(run, out):
            for event in builder.feed(p):
                yield event
        if out.finished and (failure := engine_failure(out)) is not None:
            for event in builder.finish():
                yield event
            yield {"type": "response.failed", "response": _body(req, meta, "failed", builder.items, run, failure)}
            return
    for event in builder.finish():
        yield event
    status = _status(run)
    body = _body(req, meta, status, builder.items, run)
    _remember(request, req, body, conversation)
    yield {"type": f"response.{status}", "response": body}


async def _sse(events: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    seq = 0

    def encode(event: dict) -> bytes:
        nonlocal seq
        event = {**event, "sequence_number": seq}
        seq += 1
        data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
        return f"event: {event['type']}\ndata: {data}\n\n".encode()

    try:
        async for event in events:
            yield encode(event)
    except APIError as exc:
        yield encode({"type": "error", "code": exc.code or exc.type, "message": exc.message, "param": exc.param})
    except MetraleError as exc:
        yield encode({"type": "error", "code": "invalid_request_error", "message": str(exc), "param": None})
    except Exception as exc:
        logger.opt(exception=exc).error("responses stream failed")
        yield encode(
            {
                "type": "error",
                "code": "server_error",
                "param": None,
                "message": f"internal server error ({type(exc).__name__})",
            }
        )


def _not_found(response_id: str) -> APIError:
    return APIError(404, f"no stored response with id {response_id!r}", param="response_id", code="response_not_found")


@get(
    "/v1/responses/{response_id:str}",
    operation_id="getResponse",
    tags=["openai"],
    summary="Retrieve a stored response",
    sync_to_thread=False,
    operation_class=documented(None, (401, 404, 500), ok="ResponseObject"),
)
def get_response(request: Request, response_id: Annotated[str, PathParameter()]) -> Response:
    stored = _store(request).get(response_id)
    if stored is None:
        raise _not_found(response_id)
    return Response(stored.body, media_type="application/json")


@delete(
    "/v1/responses/{response_id:str}",
    operation_id="deleteResponse",
    tags=["openai"],
    summary="Delete a stored response",
    status_code=200,
    sync_to_thread=False,
    operation_class=documented(None, (401, 404, 500), ok="ResponseDeleted"),
)
def delete_response(request: Request, response_id: Annotated[str, PathParameter()]) -> Response:
    if not _store(request).delete(response_id):
        raise _not_found(response_id)
    return Response({"id": response_id, "object": "response.deleted", "deleted": True}, media_type="application/json")


#: The Responses routes (mounted under the app's API router: bearer auth, OpenAI errors).
response_handlers = [create_response, get_response, delete_response]
