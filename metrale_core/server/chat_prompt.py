"""A chat request -> the prompt ids the engine runs, and the per-sequence stream-parser factory.

Owner: the chat route (and ``/tokenize`` for ``messages``).  Messages and tools become the plain
dicts HF chat templates expect; the template is rendered by
``Tokenizer.apply_chat_template`` (sandboxed jinja2, transformers semantics) with the request's
``chat_template_kwargs`` (``enable_thinking``, ...).

Invariants:
- Roles are ``system``, ``developer`` (rendered as ``system``), ``user``, ``assistant``, ``tool``;
  anything else is a 400 naming ``messages[i].role``.  Only text content parts are served; an
  image/audio/file part is a 400 naming its path, never silently dropped.
- Assistant ``tool_calls`` reach the template with ``arguments`` as a dict when they are a JSON
  object (what Qwen/Llama templates expect), else as the string given.  What a template asks
  beyond that (Phi-4-mini's tools in the system message, Mistral's 9-character ids) is
  ``template_adapt``'s; a request's ``reasoning_effort`` is the template variable of that name
  (gpt-oss) unless ``chat_template_kwargs`` sets it.
- ``tool_choice``: ``none`` renders the tools but parses no calls; ``auto`` and ``required`` parse
  calls; a named function must be one of ``tools`` (400 otherwise).  ``required`` and a named
  function are enforced by a grammar when a structured-output plugin is installed
  (``server.structured``; without one such a request is a 400).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from metrale_core.server.errors import APIError
from metrale_core.server.schemas import ChatCompletionRequest, ChatMessage, NamedToolChoice

__all__ = [
    "chat_prompt",
    "parser_factory",
    "reasoning_format",
    "render_messages",
    "template_kwargs",
    "template_messages",
    "template_tools",
    "wants_tool_parsing",
]

_ROLES = ("system", "developer", "user", "assistant", "tool")
#: Names the renderer itself takes; a ``chat_template_kwargs`` key may not override them.
_RESERVED = ("messages", "tools", "add_generation_prompt", "template", "self", "time_budget_s", "max_chars")


def _text(message: ChatMessage, path: str) -> str | None:
    content = message.content
    if content is None or isinstance(content, str):
        return content
    pieces = []
    for j, part in enumerate(content):
        if part.type in ("text", "refusal"):
            value = part.text if part.type == "text" else part.refusal
            if value is None:
                raise APIError(
                    400,
                    f"{path}.content[{j}].{part.type}: required for a {part.type!r} content part",
                    param=f"{path}.content[{j}].{part.type}",
                )
            pieces.append(value)
        else:
            raise APIError(
                400,
                f"{path}.content[{j}].type: only 'text' content parts are supported, got {part.type!r}",
                param=f"{path}.content[{j}].type",
            )
    return "".join(pieces)


def _arguments(text: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The conversation as template-ready dicts; 400 with a path for what cannot be served."""
    if not messages:
        raise APIError(400, "messages: must contain at least one message", param="messages")
    out = []
    for i, m in enumerate(messages):
        path = f"messages[{i}]"
        if m.role not in _ROLES:
            raise APIError(
                400, f"{path}.role: must be one of {', '.join(_ROLES)}, got {m.role!r}", param=f"{path}.role"
            )
        if m.audio is not None or m.function_call is not None:
            field = "audio" if m.audio is not None else "function_call"
            raise APIError(400, f"{path}.{field}: not supported; use tool_calls", param=f"{path}.{field}")
        if m.tool_calls and m.role != "assistant":
            raise APIError(
                400, f"{path}.tool_calls: only assistant messages carry tool calls", param=f"{path}.tool_calls"
            )
        if m.role == "tool" and not m.tool_call_id:
            raise APIError(400, f"{path}.tool_call_id: required for a tool message", param=f"{path}.tool_call_id")
        content = _text(m, path)
        if content is None and not (m.role == "assistant" and m.tool_calls):
            raise APIError(400, f"{path}.content: required for a {m.role} message", param=f"{path}.content")
        item: dict[str, Any] = {
            "role": "system" if m.role == "developer" else m.role,
            "content": content if content is not None else "",
        }
        if m.name is not None:
            item["name"] = m.name
        if m.tool_call_id is not None:
            item["tool_call_id"] = m.tool_call_id
        if m.reasoning_content is not None:
            item["reasoning_content"] = m.reasoning_content
        if m.tool_calls:
            item["tool_calls"] = [
                {
                    "id": c.id,
                    "type": c.type,
                    "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)},
                }
                for c in m.tool_calls
            ]
        out.append(item)
    return out


def template_tools(req: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """``tools`` as plain dicts (None when absent); checks ``tool_choice`` against them."""
    if req.functions is not None or req.function_call is not None:
        field = "functions" if req.functions is not None else "function_call"
        raise APIError(
            400, f"{field}: the deprecated functions API is not supported; use tools and tool_choice", param=field
        )
    tools: list[dict[str, Any]] | None = None
    if req.tools:
        tools = []
        for i, tool in enumerate(req.tools):
            if tool.type != "function":
                raise APIError(400, f"tools[{i}].type: must be 'function', got {tool.type!r}", param=f"tools[{i}].type")
            fn: dict[str, Any] = {"name": tool.function.name}
            if tool.function.description is not None:
                fn["description"] = tool.function.description
            fn["parameters"] = tool.function.parameters or {"type": "object", "properties": {}}
            props = fn["parameters"].get("properties")
            if props is not None and not isinstance(props, dict):
                raise APIError(
                    400,
                    f"tools[{i}].function.parameters.properties: must be an "
                    f"object (a JSON schema), got {type(props).__name__}",
                    param=f"tools[{i}].function.parameters.properties",
                )
            tools.append({"type": "function", "function": fn})
    choice = req.tool_choice
    if isinstance(choice, str) and choice not in ("none", "auto", "required"):
        raise APIError(
            400,
            f"tool_choice: must be 'none', 'auto', 'required' or a named function, got {choice!r}",
            param="tool_choice",
        )
    if choice is not None and choice != "none" and not tools:
        raise APIError(400, "tool_choice: needs tools", param="tool_choice")
    if isinstance(choice, NamedToolChoice):
        names = [t["function"]["name"] for t in tools or ()]
        if choice.type != "function" or choice.function.name not in names:
            raise APIError(
                400,
                f"tool_choice.function.name: {choice.function.name!r} is not one of the tools ({', '.join(names)})",
                param="tool_choice.function.name",
            )
    return tools


def wants_tool_parsing(req: ChatCompletionRequest) -> bool:
    return bool(req.tools) and req.tool_choice != "none"


def chat_prompt(tokenizer: Any, req: ChatCompletionRequest, max_model_len: int = 1 << 30) -> tuple[list[int], str]:
    """Render the conversation with the model's chat template: ``(prompt ids, prompt text)``.

    CPU work (template, tokenizer): the routes run it off the event loop (``offload``)."""
    for field in ("audio", "prediction", "web_search_options"):
        if getattr(req, field) is not None:
            raise APIError(400, f"{field}: not supported by this server", param=field)
    if req.modalities is not None and any(m != "text" for m in req.modalities):
        raise APIError(400, "modalities: only 'text' output is supported", param="modalities")
    messages = template_messages(req.messages)
    tools = template_tools(req)
    kwargs = req.chat_template_kwargs
    if req.reasoning_effort is not None and "reasoning_effort" not in (kwargs or {}):
        kwargs = {**(kwargs or {}), "reasoning_effort": req.reasoning_effort}  # gpt-oss's template reads it
    text = render_messages(
        tokenizer,
        messages,
        tools=tools,
        add_generation_prompt=req.add_generation_prompt,
        chat_template_kwargs=kwargs,
        max_model_len=max_model_len,
    )
    return tokenizer.encode(text, add_special_tokens=False), text


def template_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """``chat_template_kwargs`` checked against the renderer's own parameters."""
    kwargs = dict(kwargs or {})
    for reserved in _RESERVED:
        if reserved in kwargs:
            hint = (
                "set it as a request field"
                if reserved in ("messages", "tools", "add_generation_prompt")
                else "reserved by the server"
            )
            raise APIError(400, f"chat_template_kwargs.{reserved}: {hint}", param=f"chat_template_kwargs.{reserved}")
    return kwargs


def _chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_chars(v) for v in value.values())
    if isinstance(value, list):
        return sum(_chars(v) for v in value)
    return 0


def render_messages(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
    chat_template_kwargs: dict[str, Any] | None,
    max_model_len: int,
) -> str:
    """The rendered prompt text; 400 before rendering when the conversation cannot fit the
    context, and the render bounded to what the context can hold (``guards``)."""
    from metrale_core.server.guards import check_prompt_chars, max_prompt_chars
    from metrale_core.server.template_adapt import adapt_messages

    kwargs = template_kwargs(chat_template_kwargs)
    check_prompt_chars(_chars(messages), tokenizer, max_model_len, "messages")
    template = getattr(tokenizer, "chat_template", None)
    messages = adapt_messages(template if isinstance(template, str) else None, messages, tools)
    text = tokenizer.apply_chat_template(
        messages,
        add_generation_prompt=add_generation_prompt,
        tools=tools,
        max_chars=max_prompt_chars(tokenizer, max_model_len) + (1 << 20),
        **kwargs,
    )
    check_prompt_chars(len(text), tokenizer, max_model_len, "messages")
    return text


def reasoning_format(host: Any) -> str | None:
    """The reasoning format to split off: ``--reasoning-parser``, else by the chat template
    (harmony) or the model type."""
    from metrale_core.server.structured import served_chat_template
    from metrale_core.streamparse import default_reasoning

    name = host.config.reasoning_parser
    if name == "none":
        return None
    if name is None or name == "auto":
        model_type = host.served.model_type if host.served is not None else None
        return default_reasoning(model_type, served_chat_template(host))
    return name


def parser_factory(host: Any, req: ChatCompletionRequest, prompt_text: str) -> Callable[[], dict] | None:
    """A factory of per-sequence extras holding a fresh stream parser, or None when not needed.

    A parser is attached when the request's tools are to be parsed (``--tool-call-parser``, else
    the format the chat template asks for, else the parser registered for the model type, else
    ``hermes``), or when a reasoning format
    applies (``--reasoning-parser``, else by model type) so ``<think>`` text goes to
    ``reasoning_content``.  A prompt that already opened ``<think>`` starts in reasoning.
    """
    from metrale_core.server.structured import served_chat_template
    from metrale_core.streamparse import make_stream_parser

    reasoning = reasoning_format(host)
    tools = template_tools(req) if wants_tool_parsing(req) else None
    if tools is None and reasoning is None:
        return None
    tool_parser = host.config.tool_call_parser if tools is not None else "none"
    model_type = host.served.model_type if host.served is not None else None
    starts_in_reasoning = reasoning is not None and prompt_text.rstrip().endswith("<think>")
    registry = host.registry
    chat_template = served_chat_template(host)

    def make() -> dict:
        return {
            "stream_parser": make_stream_parser(
                registry,
                tool_parser=tool_parser,
                reasoning=reasoning,
                tools=tools,
                model_type=model_type,
                starts_in_reasoning=starts_in_reasoning,
                chat_template=chat_template,
            )
        }

    return make
