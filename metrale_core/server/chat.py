"""``POST /v1/chat/completions``: OpenAI chat, streamed (SSE) or whole.

Owner: the server.  The request is validated (``schemas``), then rendered with the chat template
and split into one engine request per choice by the chat path every chat API shares
(``translate.start_chat``), and answered in
OpenAI's ``chat.completion`` / ``chat.completion.chunk`` shapes.

Invariants:
- Streaming: per choice the first chunk carries ``role: assistant``, then content /
  ``reasoning_content`` / ``tool_calls`` deltas, then an empty delta with ``finish_reason``;
  with ``stream_options.include_usage`` every chunk has ``usage: null`` and one last chunk with
  no choices carries the usage; ``data: [DONE]`` ends the stream.
- With a stream parser attached (tools or a reasoning parser), the text a client sees is the
  parser's ``content``; otherwise it is the engine's text delta.  A choice that produced a tool
  call and stopped normally finishes with ``"tool_calls"``.
- Usage is exact: prompt tokens of the rendered prompt once, completion tokens summed over the
  choices (every generated token, the final EOS included).
- An engine-side failure (``error``, ``abort`` at shutdown) is an OpenAI-shaped error: the
  response status for a whole response, one error event (then ``[DONE]``) for a stream.  A
  request that reaches ``--request-timeout`` is not an error: it ends with the text generated so
  far and ``finish_reason: "timeout"``.
- A whole response is computed under ``while_connected``: a client that disconnects aborts it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

from attrs import define, field
from litestar import Request, Response
from litestar.di import NamedDependency

from metrale_core.server.common import new_id, usage, while_connected
from metrale_core.server.deps import body_post
from metrale_core.server.errors import APIError
from metrale_core.server.logprobs import TokenNamer, chat_logprobs
from metrale_core.server.schemas import ChatCompletionRequest
from metrale_core.server.streaming import sse_response
from metrale_core.server.translate import start_chat

__all__ = ["chat_completions", "engine_failure"]


def engine_failure(out: Any) -> APIError | None:
    """The error for a delta that finished abnormally, else None."""
    reason = out.finish_reason
    if reason == "error":
        return APIError(500, f"generation failed: {out.error}", type="server_error")
    if reason == "abort":
        return APIError(503, "the request was cancelled because the server is shutting down", code="shutting_down")
    return None


@define
class _Choice:
    """What one choice accumulated (whole responses) and what it needs for the stream."""

    index: int
    parsed: bool
    content: list[str] = field(factory=list)
    reasoning: list[str] = field(factory=list)
    #: tool_call_index -> {"id", "type", "function": {"name", "arguments"}}
    calls: dict[int, dict] = field(factory=dict)
    logprobs: list[dict] = field(factory=list)
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0

    def delta(self, out: Any) -> dict[str, Any]:
        """Apply one engine delta; returns the OpenAI ``delta`` object for it (may be empty)."""
        delta: dict[str, Any] = {}
        if not self.parsed:
            if out.text_delta:
                delta["content"] = out.text_delta
                self.content.append(out.text_delta)
        else:
            for p in out.parsed:
                if p.reasoning:
                    delta["reasoning_content"] = delta.get("reasoning_content", "") + p.reasoning
                    self.reasoning.append(p.reasoning)
                if p.content:
                    delta["content"] = delta.get("content", "") + p.content
                    self.content.append(p.content)
                if p.tool_call_index is not None:
                    delta.setdefault("tool_calls", []).append(self._call_delta(p))
        if out.finished:
            self.finish_reason = out.finish_reason
            if self.calls and out.finish_reason == "stop":
                self.finish_reason = "tool_calls"
            self.num_prompt_tokens = out.num_prompt_tokens
            self.num_output_tokens = out.num_output_tokens
        return delta

    def _call_delta(self, p: Any) -> dict[str, Any]:
        call = self.calls.get(p.tool_call_index)
        piece: dict[str, Any] = {"index": p.tool_call_index}
        fn: dict[str, Any] = {}
        if call is None:
            call = self.calls[p.tool_call_index] = {
                "id": p.tool_call_id or new_id("call"),
                "type": "function",
                "function": {"name": p.name or "", "arguments": ""},
            }
            piece.update(id=call["id"], type="function")
            fn["name"] = call["function"]["name"]
        elif p.name and not call["function"]["name"]:
            call["function"]["name"] = fn["name"] = p.name
        if p.arguments:
            call["function"]["arguments"] += p.arguments
            fn["arguments"] = p.arguments
        elif "name" in fn:
            fn["arguments"] = ""
        piece["function"] = fn
        return piece

    def message(self) -> dict[str, Any]:
        content = "".join(self.content)
        msg: dict[str, Any] = {"role": "assistant", "content": content if content or not self.calls else None}
        if self.reasoning:
            msg["reasoning_content"] = "".join(self.reasoning)
        if self.calls:
            msg["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        return msg


@body_post(
    "/v1/chat/completions",
    ChatCompletionRequest,
    tag="openai",
    ok="ChatCompletion",
    stream=True,
    operation_id="createChatCompletion",
    summary="Create a chat completion (OpenAI-compatible)",
)
async def chat_completions(
    request: Request,
    host: NamedDependency[Any],
    req: NamedDependency[ChatCompletionRequest],
    model_name: NamedDependency[str],
    tokenizer: NamedDependency[Any],
) -> Response:
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs: needs logprobs=true", param="top_logprobs")
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    run = await start_chat(host, req, max_tokens=max_tokens, logprobs=logprobs)
    choices = {index: _Choice(index, parsed=run.planned.parsed) for index in run.planned.prompts}
    namer = TokenNamer(tokenizer) if req.logprobs else None
    meta = {"id": new_id("chatcmpl"), "created": int(time.time()), "model": model_name}
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return sse_response(_stream(run.planned.stream, choices, namer, meta, include_usage))

    async def collect() -> None:
        async with aclosing(run.planned.stream) as stream:
            async for index, out in stream:
                choice = choices[index]
                choice.delta(out)
                if namer is not None and out.logprobs:
                    choice.logprobs += chat_logprobs(namer, out.logprobs)
                if out.finished and (failure := engine_failure(out)) is not None:
                    raise failure

    await while_connected(request, collect())
    body = {
        **meta,
        "object": "chat.completion",
        "system_fingerprint": None,
        "choices": [
            {
                "index": c.index,
                "message": c.message(),
                "logprobs": {"content": c.logprobs} if namer is not None else None,
                "finish_reason": c.finish_reason,
            }
            for c in choices.values()
        ],
        "usage": usage(run.prompt_tokens, sum(c.num_output_tokens for c in choices.values())),
    }
    return Response(body, media_type="application/json")


async def _stream(
    outputs: AsyncGenerator[tuple[int, Any], None],
    choices: dict[int, _Choice],
    namer: TokenNamer | None,
    meta: dict,
    include_usage: bool,
) -> AsyncIterator[dict[str, Any]]:
    head = {**meta, "object": "chat.completion.chunk", "system_fingerprint": None}
    extra = {"usage": None} if include_usage else {}

    def chunk(index: int, delta: dict, logprobs: Any = None, finish: str | None = None) -> dict:
        return {
            **head,
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
            **extra,
        }

    for index in choices:
        yield chunk(index, {"role": "assistant", "content": ""})
    async with aclosing(outputs) as stream:
        async for index, out in stream:
            choice = choices[index]
            delta = choice.delta(out)
            lp = {"content": chat_logprobs(namer, out.logprobs)} if namer and out.logprobs else None
            if delta or lp:
                yield chunk(index, delta, lp)
            if out.finished:
                if (failure := engine_failure(out)) is not None:
                    raise failure
                yield chunk(index, {}, None, choice.finish_reason)
    if include_usage:
        prompt_tokens = next(iter(choices.values())).num_prompt_tokens
        yield {**head, "choices": [], "usage": usage(prompt_tokens, sum(c.num_output_tokens for c in choices.values()))}
