"""The one chat path under every chat API: plan a chat request, run it, yield pieces.

Owner: ``server.chat``, ``server.responses``, ``server.messages`` and ``server.ollama``.  Each
of the last three translates its request into a
:class:`~metrale_core.server.schemas.ChatCompletionRequest`; each calls :func:`start_chat`,
which renders it with the same chat template (``chat_prompt``), attaches the same stream parser
(tool calls, reasoning; ``parser_factory``) and plans it with the same checks (``plan_jobs``) as
``/v1/chat/completions``.  :func:`pieces` then turns each engine delta into typed
:class:`Piece` records (text, reasoning, the start of a tool call, a fragment of its arguments)
that each API maps onto its own events.

Invariants:
- Everything that can reject the request runs in :func:`start_chat`, before the first engine
  request is added (so a rejection is a clean 4xx, never a half-started stream).
- Without a stream parser the engine's text delta is text; with one, the parser's pieces are
  used (tool-call arguments are never sent as text).
- A tool call's first piece is ``call`` (with its id and name), followed by ``args`` fragments
  that concatenate to the arguments JSON.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from typing import Any

from attrs import define, field, frozen

from metrale_core.server.chat_prompt import chat_prompt, parser_factory
from metrale_core.server.common import new_id
from metrale_core.server.errors import APIError
from metrale_core.server.generation import Planned, plan_jobs
from metrale_core.server.offload import off_loop
from metrale_core.server.structured import chat_structured_output
from metrale_core.server.thinking_budget import chat_reasoning_budget

__all__ = ["ChatRun", "Piece", "call_arguments", "pieces", "renamed", "start_chat"]


@frozen
class Piece:
    """One translated piece of output."""

    #: ``text`` | ``reasoning`` | ``call`` (a tool call starts) | ``args`` (arguments fragment)
    kind: str
    text: str = ""
    #: For ``call`` / ``args``: the call's index in this response.
    index: int = 0
    call_id: str = ""
    name: str = ""


@define
class ChatRun:
    """A planned chat request and what its output accumulated."""

    host: Any
    #: Its choices and their stream (``plan_jobs``; iterating the stream releases the request's
    #: admission at the end).
    planned: Planned
    prompt_tokens: int
    calls: dict[int, dict] = field(factory=dict)
    finish_reason: str | None = None
    output_tokens: int = 0
    #: The engine's final delta (``finish_reason`` ``error``/``timeout``/``abort`` included).
    final: Any = None

    async def outputs(self) -> AsyncIterator[Any]:
        """The engine deltas of its one choice; closing this generator aborts the engine
        request at once."""
        async with aclosing(self.planned.stream) as stream:
            async for _, out in stream:
                if out.finished:
                    self.final = out
                    self.finish_reason = out.finish_reason
                    self.output_tokens = out.num_output_tokens
                yield out


async def start_chat(
    host: Any,
    req: Any,
    *,
    max_tokens: int | None,
    logprobs: int | None = None,
    budget_field: str = "thinking_token_budget",
    raw_prompt: str | None = None,
) -> ChatRun:
    """Render (off the event loop), validate and plan ``req`` (a ``ChatCompletionRequest``) as
    ``req.n`` engine requests, with chat's structured-output constraint (``text.format`` and the
    like) and reasoning budget (``budget_field``: what the API calls ``thinking_token_budget``);
    ``logprobs``: top logprobs per token (None: none).
    ``raw_prompt``: this text is the whole prompt (tokenized with the model's special tokens),
    not the chat template's rendering of ``req.messages`` (Ollama's ``raw``)."""
    served = host.ready()
    if raw_prompt is None:
        prompt, prompt_text = await off_loop(chat_prompt, served.tokenizer, req, served.engine.max_model_len)
    else:
        prompt, prompt_text = await off_loop(served.tokenizer.encode, raw_prompt, True), raw_prompt
    extras = parser_factory(host, req, prompt_text)
    structured = chat_structured_output(host, req, prompt_text)
    budget = chat_reasoning_budget(host, req, prompt_text, field=budget_field)
    planned = await plan_jobs(
        host,
        req,
        [prompt],
        max_tokens=max_tokens,
        logprobs=logprobs,
        extras_factory=extras,
        structured=structured,
        reasoning_budget=budget,
    )
    return ChatRun(host=host, planned=planned, prompt_tokens=len(prompt))


def pieces(run: ChatRun, out: Any) -> Iterator[Piece]:
    """The pieces of one engine delta (see the module docstring)."""
    if not run.planned.parsed:
        if out.text_delta:
            yield Piece("text", out.text_delta)
        return
    for p in out.parsed:
        if p.reasoning:
            yield Piece("reasoning", p.reasoning)
        if p.content:
            yield Piece("text", p.content)
        if p.tool_call_index is not None:
            call = run.calls.get(p.tool_call_index)
            if call is None:
                call = run.calls[p.tool_call_index] = {
                    "id": p.tool_call_id or new_id("call"),
                    "name": p.name or "",
                    "arguments": "",
                }
                yield Piece("call", index=p.tool_call_index, call_id=call["id"], name=call["name"])
            if p.arguments:
                call["arguments"] += p.arguments
                yield Piece("args", p.arguments, index=p.tool_call_index, call_id=call["id"])


def call_arguments(arguments: str) -> dict:
    """A tool call's gathered ``arguments`` as the JSON object the Anthropic and Ollama APIs send
    (``{}`` when they are empty, no JSON, or JSON but not an object)."""
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def renamed(exc: APIError, chat_field: str, api_field: str) -> APIError:
    """``exc`` with a chat field path (``response_format.type``) renamed to the API's own
    (``text.format.type``), so an error names what the client sent; other errors unchanged."""
    if not (exc.param and exc.param.startswith(chat_field)):
        return exc
    path = api_field + exc.param[len(chat_field) :]
    return APIError(
        exc.status,
        exc.message.replace(exc.param, path, 1),
        param=path,
        code=exc.code,
        type=exc.type,
        headers=exc.headers,
    )
