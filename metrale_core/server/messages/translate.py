"""Anthropic Messages request -> the internal chat request (one chat path under both APIs).

Owner: ``server.messages.route``.  :func:`to_chat` checks what only the Messages API knows (block
types, roles, ``tool_choice`` forms, ranges) with errors naming the Messages field, then builds
a :class:`~metrale_core.server.schemas.ChatCompletionRequest` that the chat template renderer,
the tool-call parser and the reasoning splitter handle exactly as for ``/v1/chat/completions``.

Mapping:
- ``system`` (string or text blocks) -> a leading ``system`` message.
- user ``text`` blocks -> the user message; ``tool_result`` blocks -> ``tool`` messages (before
  the user's text, in order).
- assistant ``text`` -> content, ``tool_use`` -> ``tool_calls`` (``input`` as JSON),
  ``thinking`` -> ``reasoning_content``; ``redacted_thinking`` is dropped.
- ``tools[].input_schema`` -> ``function.parameters``; ``tool_choice`` ``auto``/``any``/``tool``/
  ``none`` -> ``auto``/``required``/named/``none``.
- ``thinking.type`` ``enabled``/``adaptive`` -> ``enable_thinking=True``; ``disabled`` or absent ->
  ``enable_thinking=False`` (templates that do not know the flag ignore it).
- ``thinking.budget_tokens`` (``enabled``) -> ``thinking_token_budget``: the reasoning is ended
  (``</think>`` forced) once it has that many tokens; it must be less than ``max_tokens``, as
  Anthropic's API requires (its minimum of 1,024 is not: small models think briefly).
- ``stop_sequences`` -> ``stop``; ``max_tokens``, ``temperature``, ``top_p``, ``top_k`` as is.

Invariants:
- ``output_config.format`` (``json_schema``) -> ``response_format``, refused or honoured exactly
  as chat's is (errors renamed to ``output_config.format`` by the route).
- Images, documents and server tools are a 400 naming the field, never silently dropped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from metrale_core.server.errors import APIError
from metrale_core.server.messages.records import CountTokensRequest, MessagesRequest
from metrale_core.server.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    FunctionDef,
    NamedFunction,
    NamedToolChoice,
    ResponseFormat,
    Tool,
    ToolCall,
)

__all__ = ["to_chat"]


def _bad(path: str, message: str) -> APIError:
    return APIError(400, f"{path}: {message}", param=path)


def _block_text(block: Any, path: str) -> str:
    if not isinstance(block, dict):
        raise _bad(path, "must be a content block object")
    if block.get("type") != "text":
        raise _bad(f"{path}.type", f"must be 'text' here, got {block.get('type')!r}")
    text = block.get("text")
    if not isinstance(text, str):
        raise _bad(f"{path}.text", "must be a string")
    return text


def _system(system: Any) -> str | None:
    if system is None or isinstance(system, str):
        return system
    if not isinstance(system, list):
        raise _bad("system", "must be a string or an array of text blocks")
    return "\n".join(_block_text(b, f"system[{i}]") for i, b in enumerate(system))


def _tool_result_text(content: Any, path: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(path, "must be a string or an array of text blocks")
    return "".join(_block_text(b, f"{path}[{i}]") for i, b in enumerate(content))


def _blocks(content: Any, path: str) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise _bad(path, "must be a string or an array of content blocks")
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise _bad(f"{path}[{j}]", "must be a content block object with a string 'type'")
    return content


def _typed(blocks: list[dict], path: str) -> Iterator[tuple[str, str, dict]]:
    """Each content block (checked by ``_blocks``) with its path and its ``type``."""
    for j, block in enumerate(blocks):
        yield f"{path}[{j}]", block["type"], block


def _user(blocks: list[dict], path: str) -> list[ChatMessage]:
    results, texts = [], []
    for p, kind, b in _typed(blocks, path):
        if kind == "text":
            texts.append(_block_text(b, p))
        elif kind == "tool_result":
            tool_use_id = b.get("tool_use_id")
            if not isinstance(tool_use_id, str) or not tool_use_id:
                raise _bad(f"{p}.tool_use_id", "required (the id of the tool_use it answers)")
            text = _tool_result_text(b.get("content"), f"{p}.content")
            if b.get("is_error"):
                text = f"Error: {text}"
            results.append(ChatMessage(role="tool", content=text, tool_call_id=tool_use_id))
        else:
            raise _bad(
                f"{p}.type",
                f"{kind!r} blocks are not supported in user turns by this server (text and tool_result are)",
            )
    out = list(results)
    if texts or not results:
        out.append(ChatMessage(role="user", content="".join(texts)))
    return out


def _assistant(blocks: list[dict], path: str) -> ChatMessage:
    texts, thinking, calls = [], [], []
    for p, kind, b in _typed(blocks, path):
        if kind == "text":
            texts.append(_block_text(b, p))
        elif kind == "thinking":
            if not isinstance(b.get("thinking"), str):
                raise _bad(f"{p}.thinking", "must be a string")
            thinking.append(b["thinking"])
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use":
            for key in ("id", "name"):
                if not isinstance(b.get(key), str) or not b[key]:
                    raise _bad(f"{p}.{key}", "required string")
            if not isinstance(b.get("input"), dict):
                raise _bad(f"{p}.input", "must be an object")
            calls.append(
                ToolCall(
                    id=b["id"],
                    function=FunctionCall(name=b["name"], arguments=json.dumps(b["input"], ensure_ascii=False)),
                )
            )
        else:
            raise _bad(f"{p}.type", f"{kind!r} blocks are not supported in assistant turns")
    return ChatMessage(
        role="assistant",
        content="".join(texts) if texts or not calls else None,
        tool_calls=calls or None,
        reasoning_content="".join(thinking) if thinking else None,
    )


def _tools(req: CountTokensRequest) -> list[Tool] | None:
    if not req.tools:
        return None
    tools = []
    for i, t in enumerate(req.tools):
        if t.type not in (None, "custom"):
            raise _bad(
                f"tools[{i}].type",
                f"server tool {t.type!r} cannot run here; only client tools with an input_schema are supported",
            )
        if t.input_schema is None:
            raise _bad(f"tools[{i}].input_schema", "field required")
        tools.append(
            Tool(
                type="function", function=FunctionDef(name=t.name, description=t.description, parameters=t.input_schema)
            )
        )
    return tools


def _tool_choice(choice: dict | None, tools: list[Tool] | None) -> Any:
    if choice is None:
        return None
    kind = choice.get("type")
    names = [t.function.name for t in tools or ()]
    if kind == "none":
        return "none"
    if not tools:
        raise _bad("tool_choice", "needs tools")
    if kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    if kind == "tool":
        name = choice.get("name")
        if name not in names:
            raise _bad("tool_choice.name", f"{name!r} is not one of the tools ({', '.join(names)})")
        return NamedToolChoice(type="function", function=NamedFunction(name=name))
    raise _bad("tool_choice.type", f"must be 'auto', 'any', 'tool' or 'none', got {kind!r}")


def _budget(thinking: dict | None) -> int | None:
    """``thinking.budget_tokens`` of an ``enabled`` thinking config (checked by :func:`_thinking`)."""
    if thinking is None or thinking.get("type") != "enabled":
        return None
    return thinking.get("budget_tokens")


def _thinking(thinking: dict | None) -> bool:
    if thinking is None:
        return False
    kind = thinking.get("type")
    if kind not in ("enabled", "disabled", "adaptive"):
        raise _bad("thinking.type", f"must be 'enabled', 'adaptive' or 'disabled', got {kind!r}")
    budget = thinking.get("budget_tokens")
    if (
        kind == "enabled"
        and budget is not None
        and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 1)
    ):
        raise _bad("thinking.budget_tokens", "must be a positive integer")
    return kind != "disabled"


def _ranges(req: MessagesRequest) -> None:
    checks = (
        ("max_tokens", req.max_tokens, lambda v: v >= 1, "must be >= 1"),
        ("temperature", req.temperature, lambda v: 0.0 <= v <= 1.0, "must be between 0 and 1"),
        ("top_p", req.top_p, lambda v: 0.0 < v <= 1.0, "must be in (0, 1]"),
        ("top_k", req.top_k, lambda v: v >= 0, "must be >= 0"),
    )
    for name, value, ok, rule in checks:
        if value is not None and not ok(value):
            raise _bad(name, f"{rule}, got {value!r}")
    for i, s in enumerate(req.stop_sequences or ()):
        if not s:
            raise _bad(f"stop_sequences[{i}]", "must not be empty")


def _response_format(config: dict | None) -> ResponseFormat | None:
    fmt = (config or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise _bad("output_config.format", 'must be {"type": "json_schema", "schema": {...}}')
    return ResponseFormat(type="json_schema", json_schema={"name": "output", "schema": fmt["schema"]})


def to_chat(req: CountTokensRequest) -> ChatCompletionRequest:
    """The chat request equivalent to ``req`` (a Messages or count_tokens request)."""
    messages: list[ChatMessage] = []
    system = _system(req.system)
    if system is not None:
        messages.append(ChatMessage(role="system", content=system))
    if not req.messages:
        raise _bad("messages", "must contain at least one message")
    for i, m in enumerate(req.messages):
        path = f"messages[{i}]"
        if m.role not in ("user", "assistant"):
            raise _bad(f"{path}.role", f"must be 'user' or 'assistant', got {m.role!r}")
        blocks = _blocks(m.content, f"{path}.content")
        if m.role == "user":
            messages += _user(blocks, f"{path}.content")
        else:
            messages.append(_assistant(blocks, f"{path}.content"))
    tools = _tools(req)
    fields: dict[str, Any] = dict(
        model=req.model,
        messages=messages,
        tools=tools,
        response_format=_response_format(req.output_config),
        tool_choice=_tool_choice(req.tool_choice, tools),
        chat_template_kwargs={"enable_thinking": _thinking(req.thinking)},
        thinking_token_budget=_budget(req.thinking),
    )
    if isinstance(req, MessagesRequest):
        _ranges(req)
        budget = fields["thinking_token_budget"]
        if budget is not None and budget >= req.max_tokens:
            raise _bad("thinking.budget_tokens", f"must be less than max_tokens ({req.max_tokens}), got {budget}")
        fields.update(
            max_tokens=req.max_tokens,
            stop=req.stop_sequences,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
        )
    return ChatCompletionRequest(**fields)
