"""Ollama chat / generate requests -> the internal chat request (one chat path under every API).

Owner: ``server.ollama.route``.  :func:`chat_request` and :func:`generate_request` check what only
Ollama's API knows (message roles, ``images``, ``format``, ``think``, ``tools``) with errors naming
Ollama's field, then build a :class:`~metrale_core.server.schemas.ChatCompletionRequest` that the
chat template renderer, the tool-call parser and the reasoning splitter handle exactly as for
``/v1/chat/completions``.

Mapping:
- ``messages[].thinking`` -> ``reasoning_content``; ``tool_calls[].function.arguments`` (an
  object) -> the JSON text chat carries; a ``tool`` message's ``tool_name`` -> ``name``, and the
  call it answers (``tool_call_id``) is its own or the matching call of the last assistant turn.
- ``tools`` (OpenAI's function-tool shape, which Ollama uses) -> ``tools``.
- ``format``: ``"json"`` -> ``response_format`` ``json_object``; a schema object ->
  ``json_schema``; ``""`` or absent -> none.
- ``think``: ``true`` or a level (``"low"``/``"medium"``/``"high"``) -> ``enable_thinking=True``;
  ``false`` -> ``enable_thinking=False``; absent -> the template's default.
- ``options`` -> sampling fields (``server.ollama.options``).
- generate: ``system`` -> a leading system message, ``prompt`` -> the user message; ``raw`` sends
  the prompt as is, without the chat template (``raw_prompt``).

Invariants:
- ``images`` (anywhere), ``suffix`` (fill-in-the-middle), a custom ``template``, the deprecated
  ``context`` (token ids of an earlier generate), ``logprobs`` and image generation are a 400
  naming the field: this server cannot honour them, and never drops them silently.
- ``keep_alive``, ``truncate`` and ``shift`` are accepted and change nothing (the model stays
  loaded; the prompt must fit the context).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from metrale_core.server.errors import APIError
from metrale_core.server.ollama.options import CHAT_NAMES, sampling_fields
from metrale_core.server.ollama.records import OllamaChatRequest, OllamaGenerateRequest, OllamaMessage
from metrale_core.server.ranges import check_ranges
from metrale_core.server.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    FunctionDef,
    ResponseFormat,
    Tool,
    ToolCall,
)
from metrale_core.server.translate import renamed

__all__ = ["chat_request", "generate_request", "wants_thinking"]

_ROLES = ("system", "user", "assistant", "tool")
_LEVELS = ("low", "medium", "high")


def _bad(path: str, message: str) -> APIError:
    return APIError(400, f"{path}: {message}", param=path)


def wants_thinking(think: Any) -> bool | None:
    """``think`` as ``enable_thinking`` (None: absent, the template decides)."""
    if think is None:
        return None
    if isinstance(think, bool):
        return think
    if think in _LEVELS:
        return True
    raise _bad("think", f"must be true, false or one of {', '.join(_LEVELS)}, got {think!r}")


def _response_format(fmt: Any) -> ResponseFormat | None:
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return ResponseFormat(type="json_object")
    if isinstance(fmt, dict):
        return ResponseFormat(type="json_schema", json_schema={"name": "output", "schema": fmt})
    raise _bad("format", f'must be "json" or a JSON schema object, got {fmt!r}')


def _tools(tools: list[dict] | None) -> list[Tool] | None:
    if not tools:
        return None
    out = []
    for i, t in enumerate(tools):
        fn = t.get("function")
        if t.get("type", "function") != "function" or not isinstance(fn, dict):
            raise _bad(f"tools[{i}]", 'must be {"type": "function", "function": {"name": ..., "parameters": ...}}')
        name, parameters, description = fn.get("name"), fn.get("parameters"), fn.get("description")
        if not isinstance(name, str) or not name:
            raise _bad(f"tools[{i}].function.name", "required string")
        if parameters is not None and not isinstance(parameters, dict):
            raise _bad(f"tools[{i}].function.parameters", "must be a JSON schema object")
        if description is not None and not isinstance(description, str):
            raise _bad(f"tools[{i}].function.description", "must be a string")
        out.append(
            Tool(type="function", function=FunctionDef(name=name, description=description, parameters=parameters))
        )
    return out


def _answered_call(m: OllamaMessage, pending: list[ToolCall]) -> str | None:
    """The id of the call a ``tool`` message answers: its ``tool_call_id``, else the first
    unanswered call of the last assistant turn with its ``tool_name`` (else the first
    unanswered one): Ollama's messages name the tool, not the call."""
    if m.tool_call_id:
        return m.tool_call_id
    match = next((c for c in pending if c.function.name == m.tool_name), pending[0] if pending else None)
    if match is None:
        return None
    pending.remove(match)
    return match.id


def _message(m: OllamaMessage, path: str, index: int) -> ChatMessage:
    if m.role not in _ROLES:
        raise _bad(f"{path}.role", f"must be one of {', '.join(_ROLES)}, got {m.role!r}")
    if m.images:
        raise _bad(f"{path}.images", "images are not supported by this server (the served model reads text only)")
    calls = None
    if m.tool_calls:
        if m.role != "assistant":
            raise _bad(f"{path}.tool_calls", "only assistant messages carry tool calls")
        calls = [
            ToolCall(
                id=c.id or f"call_{index}_{j}",
                function=FunctionCall(
                    name=c.function.name, arguments=json.dumps(c.function.arguments or {}, ensure_ascii=False)
                ),
            )
            for j, c in enumerate(m.tool_calls)
        ]
    return ChatMessage(
        role=m.role,
        content=m.content if m.content is not None or calls else "",
        tool_calls=calls,
        reasoning_content=m.thinking if m.role == "assistant" else None,
        name=m.tool_name if m.role == "tool" else None,
        tool_call_id=m.tool_call_id if m.role == "tool" else None,
    )


def _messages(req: OllamaChatRequest) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    pending: list[ToolCall] = []
    for i, m in enumerate(req.messages or ()):
        message = _message(m, f"messages[{i}]", i)
        if message.role == "assistant":
            pending = list(message.tool_calls or ())
        elif message.role == "tool":
            message = msgspec.structs.replace(message, tool_call_id=_answered_call(m, pending) or f"call_{i}")
        out.append(message)
    return out


def _sampling(req: OllamaChatRequest | OllamaGenerateRequest, model: str) -> dict[str, Any]:
    if req.options is not None and not isinstance(req.options, dict):
        raise _bad("options", "must be an object")
    fields = sampling_fields(req.options)
    thinking = wants_thinking(req.think)
    fields.update(
        model=model,
        response_format=_response_format(req.format),
        chat_template_kwargs=None if thinking is None else {"enable_thinking": thinking},
    )
    if req.logprobs:
        raise _bad("logprobs", "not supported on the Ollama API of this server (use /v1/chat/completions)")
    return fields


def _checked(chat: ChatCompletionRequest) -> ChatCompletionRequest:
    """``chat`` range-checked as chat's own bodies are, errors naming Ollama's option."""
    try:
        check_ranges(chat)
    except APIError as exc:
        field = (exc.param or "").split("[", 1)[0]
        raise renamed(exc, field, CHAT_NAMES[field]) if field in CHAT_NAMES else exc from None
    return chat


def chat_request(req: OllamaChatRequest, model: str) -> ChatCompletionRequest:
    """The chat request equivalent to an ``/api/chat`` body, for the served ``model`` it names."""
    messages = _messages(req)
    return _checked(ChatCompletionRequest(messages=messages, tools=_tools(req.tools), **_sampling(req, model)))


def generate_request(req: OllamaGenerateRequest, model: str) -> ChatCompletionRequest:
    """The chat request equivalent to an ``/api/generate`` body (``raw``: see ``raw_prompt``)."""
    for name in ("suffix", "template"):
        if getattr(req, name):
            raise _bad(name, "not supported by this server (it renders prompts with the model's own chat template)")
    if req.context:
        raise _bad("context", "not supported by this server; send the conversation as messages to /api/chat")
    for name in ("width", "height", "steps"):
        if getattr(req, name) is not None:
            raise _bad(name, "image generation is not supported by this server")
    if req.images:
        raise _bad("images", "images are not supported by this server (the served model reads text only)")
    messages = []
    if req.system:
        messages.append(ChatMessage(role="system", content=req.system))
    messages.append(ChatMessage(role="user", content=req.prompt or ""))
    return _checked(ChatCompletionRequest(messages=messages, **_sampling(req, model)))
