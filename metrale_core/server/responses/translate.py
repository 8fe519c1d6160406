"""Responses request -> the internal chat request (one chat path under both APIs).

Owner: ``server.responses.route``.  :func:`to_chat` checks what only the Responses API knows
(item types, hosted tools, ``text.format``, ``reasoning``) with errors naming the Responses
field, then builds a :class:`~metrale_core.server.schemas.ChatCompletionRequest` rendered by the
same chat template, tool-call parser and reasoning splitter as ``/v1/chat/completions``.

Mapping:
- ``instructions`` -> a leading ``system`` message (not carried to follow-ups, as OpenAI does).
- ``previous_response_id`` -> the stored conversation of that response, then this ``input``.
- ``input`` string -> one user message; message items (``role`` user/system/developer/assistant,
  content a string or ``input_text``/``output_text``/``refusal`` parts) -> chat messages;
  ``function_call`` items -> assistant ``tool_calls`` (consecutive calls share one assistant
  turn); ``function_call_output`` -> ``tool`` messages; ``reasoning`` items -> the next assistant
  turn's ``reasoning_content``.
- ``tools`` (flat ``{"type": "function", "name", "parameters"}``) -> chat tools; hosted tool
  types are a 400.  ``tool_choice`` ``auto``/``none``/``required``/``{"type": "function",
  "name"}`` as in chat.
- ``text.format`` -> ``response_format`` (refused or honoured exactly as chat's is).
- ``reasoning.effort`` ``none`` -> ``enable_thinking=False``; another effort -> ``True``; absent ->
  the template's default.  ``low`` / ``medium`` / ``high`` are also the template's
  ``reasoning_effort`` (gpt-oss's ``Reasoning:`` line), as chat's ``reasoning_effort`` is.
- ``max_output_tokens``, ``temperature``, ``top_p`` as is.
- ``include`` (any value) and ``truncation`` other than ``disabled`` are a 400 naming the field and
  value: this server does not drop input items to fit, and returns no extra included data.
"""

from __future__ import annotations

from typing import Any

from metrale_core.server.errors import APIError
from metrale_core.server.responses.records import ResponsesRequest
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

__all__ = ["input_messages", "output_messages", "to_chat"]

_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


def _bad(path: str, message: str) -> APIError:
    return APIError(400, f"{path}: {message}", param=path)


def _string(item: dict, key: str, path: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise _bad(f"{path}.{key}", "required string")
    return value


def _content(content: Any, path: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(path, "must be a string or an array of content parts")
    texts = []
    for j, part in enumerate(content):
        p = f"{path}[{j}]"
        if not isinstance(part, dict):
            raise _bad(p, "must be a content part object")
        kind = part.get("type")
        if kind not in _TEXT_PARTS:
            raise _bad(
                f"{p}.type",
                f"only text parts ({', '.join(_TEXT_PARTS[:2])}) are supported by this server, got {kind!r}",
            )
        texts.append(_string(part, "refusal" if kind == "refusal" else "text", p))
    return "".join(texts)


def _reasoning_text(item: dict, path: str) -> str:
    texts = []
    for key in ("content", "summary"):
        parts = item.get(key) or []
        if not isinstance(parts, list):
            raise _bad(f"{path}.{key}", "must be an array")
        for j, part in enumerate(parts):
            if not isinstance(part, dict) or not isinstance(part.get("text"), str):
                raise _bad(f"{path}.{key}[{j}].text", "required string")
            texts.append(part["text"])
        if texts:
            break
    return "".join(texts)


def input_messages(value: Any) -> list[ChatMessage]:
    """The chat messages of a Responses ``input``."""
    if isinstance(value, str):
        return [ChatMessage(role="user", content=value)]
    if not isinstance(value, list):
        raise _bad("input", "must be a string or an array of input items")
    out: list[ChatMessage] = []
    reasoning: list[str] = []
    for i, item in enumerate(value):
        path = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(path, "must be an input item object")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise _bad(f"{path}.role", f"must be one of {', '.join(_ROLES)}, got {role!r}")
            text = _content(item.get("content"), f"{path}.content")
            extra: dict[str, Any] = {}
            if role == "assistant" and reasoning:
                extra["reasoning_content"], reasoning = "".join(reasoning), []
            out.append(ChatMessage(role=role, content=text, **extra))
        elif kind == "function_call":
            call = ToolCall(
                id=_string(item, "call_id", path),
                function=FunctionCall(name=_string(item, "name", path), arguments=_string(item, "arguments", path)),
            )
            last = out[-1] if out else None
            if last is not None and last.role == "assistant" and not reasoning:
                out[-1] = ChatMessage(
                    role="assistant",
                    content=last.content or None,
                    tool_calls=[*(last.tool_calls or ()), call],
                    reasoning_content=last.reasoning_content,
                )
            else:
                extra = {"reasoning_content": "".join(reasoning)} if reasoning else {}
                reasoning = []
                out.append(ChatMessage(role="assistant", content=None, tool_calls=[call], **extra))
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _content(output, f"{path}.output")
            out.append(ChatMessage(role="tool", content=text, tool_call_id=_string(item, "call_id", path)))
        elif kind == "reasoning":
            reasoning.append(_reasoning_text(item, path))
        else:
            raise _bad(
                f"{path}.type",
                f"{kind!r} input items are not supported by this server "
                f"(message, function_call, function_call_output and "
                f"reasoning are)",
            )
    return out


def _tools(tools: list[dict] | None) -> list[Tool] | None:
    if not tools:
        return None
    out = []
    for i, t in enumerate(tools):
        path = f"tools[{i}]"
        if t.get("type") != "function":
            raise _bad(
                f"{path}.type",
                f"only 'function' tools can run on this server; hosted tool {t.get('type')!r} is not available",
            )
        unknown = set(t) - {"type", "name", "description", "parameters", "strict"}
        if unknown:
            raise _bad(f"{path}.{sorted(unknown)[0]}", "unknown field")
        name = _string(t, "name", path)
        params = t.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise _bad(f"{path}.parameters", "must be an object (a JSON Schema)")
        description = t.get("description")
        if description is not None and not isinstance(description, str):
            raise _bad(f"{path}.description", "must be a string")
        out.append(Tool(type="function", function=FunctionDef(name=name, description=description, parameters=params)))
    return out


def _tool_choice(choice: Any) -> Any:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return NamedToolChoice(type="function", function=NamedFunction(name=_string(choice, "name", "tool_choice")))
    if isinstance(choice, dict):
        raise _bad("tool_choice.type", f"only 'function' tool choices are supported, got {choice.get('type')!r}")
    raise _bad("tool_choice", "must be 'auto', 'none', 'required' or {\"type\": \"function\", \"name\": ...}")


def _response_format(text: dict | None) -> ResponseFormat | None:
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise _bad("text.format", "must be an object with a 'type'")
    if fmt["type"] not in ("text", "json_object", "json_schema"):
        raise _bad("text.format.type", f"must be 'text', 'json_object' or 'json_schema', got {fmt['type']!r}")
    if fmt["type"] != "json_schema":
        return ResponseFormat(type=fmt["type"])
    schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return ResponseFormat(type="json_schema", json_schema=schema)


def _enable_thinking(reasoning: dict | None) -> dict:
    if reasoning is None or reasoning.get("effort") is None:
        return {}
    effort = reasoning["effort"]
    if effort not in ("none", "minimal", "low", "medium", "high", "xhigh"):
        raise _bad("reasoning.effort", f"must be none, minimal, low, medium, high or xhigh, got {effort!r}")
    kwargs: dict = {"enable_thinking": effort != "none"}
    if effort in ("low", "medium", "high"):
        kwargs["reasoning_effort"] = effort
    return kwargs


def _refused(req: ResponsesRequest) -> None:
    if req.background:
        raise _bad("background", "background responses are not supported by this server")
    for name in ("conversation", "prompt"):
        if getattr(req, name) is not None:
            raise _bad(name, "not supported by this server")
    if req.top_logprobs:
        raise _bad("top_logprobs", "not supported by the Responses API of this server")
    if req.include:
        raise _bad("include[0]", f"{req.include[0]!r} is not supported by this server (no include values are)")
    if req.truncation not in (None, "disabled"):
        raise _bad(
            "truncation",
            f"only 'disabled' is supported by this server (an input too long for the context is a 400), "
            f"got {req.truncation!r}",
        )
    checks = (
        ("max_output_tokens", req.max_output_tokens, lambda v: v >= 1, "must be >= 1"),
        ("temperature", req.temperature, lambda v: 0.0 <= v <= 2.0, "must be between 0 and 2"),
        ("top_p", req.top_p, lambda v: 0.0 < v <= 1.0, "must be in (0, 1]"),
    )
    for name, value, ok, rule in checks:
        if value is not None and not ok(value):
            raise _bad(name, f"{rule}, got {value!r}")


def to_chat(req: ResponsesRequest, history: tuple = ()) -> tuple[ChatCompletionRequest, list]:
    """``(chat request, conversation)``: the conversation is ``history`` plus this input (without
    ``instructions``), what a follow-up's ``previous_response_id`` continues."""
    _refused(req)
    conversation = [*history, *input_messages(req.input)]
    if not conversation:
        raise _bad("input", "must contain at least one item")
    messages = list(conversation)
    if req.instructions is not None:
        messages.insert(0, ChatMessage(role="system", content=req.instructions))
    tools = _tools(req.tools)
    choice = _tool_choice(req.tool_choice)
    if choice not in (None, "none") and not tools:
        raise _bad("tool_choice", "needs tools")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in [t.function.name for t in tools or ()]:
        raise _bad("tool_choice.name", f"{choice.function.name!r} is not one of the tools")
    chat = ChatCompletionRequest(
        model=req.model,
        messages=messages,
        tools=tools,
        tool_choice=choice,
        response_format=_response_format(req.text),
        max_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        chat_template_kwargs=_enable_thinking(req.reasoning) or None,
    )
    return chat, conversation


def output_messages(items: list[dict]) -> list[ChatMessage]:
    """A response's output items as the assistant turn(s) a follow-up continues from."""
    return (
        input_messages(
            [
                {k: v for k, v in item.items() if k not in ("id", "status")}
                if item["type"] != "message"
                else {"role": "assistant", "content": item["content"]}
                for item in items
            ]
        )
        if items
        else []
    )
