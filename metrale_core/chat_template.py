"""Chat-template rendering: a conversation -> the prompt text, exactly as transformers renders it.

Owner: the frontend (through ``Tokenizer.apply_chat_template``).

Invariants:
- Templates run in jinja2's ``ImmutableSandboxedEnvironment`` with transformers' settings
  (``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``, the ``{% generation %}`` tag) and helpers
  (``tojson`` without HTML escaping and with ``indent``; ``raise_exception``; ``strftime_now``;
  the restricted ``dict`` and ``namespace``).  Chat templates come from model files: untrusted code.
- Variables: ``messages``, ``tools``, ``documents``, ``add_generation_prompt``, the special-token
  strings (``bos_token``, ``eos_token``, ...) and any extra keyword (``enable_thinking``, ...).
- Messages are copied to plain JSON data first; keys whose value is ``None`` are dropped and
  reasoning given as ``thinking`` / ``reasoning`` is also exposed as ``reasoning_content``.
- A template that cannot be compiled raises ``ConfigError`` (the model's fault); a conversation the
  template rejects (``raise_exception``, a bad field, a sandbox violation) raises ``InvalidRequest``.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any, Mapping, Sequence

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from metrale_core.errors import ConfigError, InvalidRequest

__all__ = ["compile_chat_template", "render_chat_template"]

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class _TemplateRaised(jinja2.exceptions.TemplateError):
    """What ``raise_exception(msg)`` raises inside a template."""


def _raise_exception(message: str):
    raise _TemplateRaised(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:
    # jinja's own tojson escapes HTML characters; transformers' does not
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """``dict(...)`` for templates without exposing the ``dict`` type itself."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """``namespace(...)`` that refuses underscore attributes (no route to CPython internals)."""

    def __init__(*args, **kwargs):  # noqa: N805 - same signature trick as jinja2.utils.Namespace
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot set underscore attribute {name!r} on a namespace")


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers' assistant-mask marker): renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


@lru_cache(maxsize=16)
def compile_chat_template(template: str) -> jinja2.Template:
    """Compile once per template string; ``ConfigError`` if it is not valid Jinja."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ConfigError(f"the model's chat template is not valid Jinja (line {exc.lineno}): {exc.message}") from exc


def _plain(value: Any) -> Any:
    """A copy built only of JSON types (plus tuples); anything else becomes an inert "<TypeName>"."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


def _normalise_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for message in messages:
        if callable(getattr(message, "model_dump", None)):
            message = message.model_dump()
        if not isinstance(message, Mapping):
            raise InvalidRequest(f"chat messages must be objects with 'role' and 'content', got {message!r}")
        message = {k: _plain(v) for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def render_chat_template(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    **template_kwargs: Any,
) -> str:
    """Render ``messages`` (and optional JSON-schema ``tools``) with ``template``.

    ``template_kwargs`` become template variables (``bos_token``, ``eos_token``, ``enable_thinking``, ...).
    """
    compiled = compile_chat_template(template)
    if tools is not None:
        for tool in tools:
            if not isinstance(tool, Mapping):
                raise InvalidRequest(f"tools must be JSON-schema objects, got {type(tool).__name__}")
    variables = {"documents": None, **_plain(template_kwargs)}
    try:
        return compiled.render(
            messages=_normalise_messages(messages),
            tools=_plain(list(tools)) if tools is not None else None,
            add_generation_prompt=bool(add_generation_prompt),
            **variables,
        )
    except _TemplateRaised as exc:
        raise InvalidRequest(f"the model's chat template rejected the conversation: {exc.message}") from exc
    except jinja2.exceptions.SecurityError as exc:
        raise InvalidRequest(f"the chat template tried an operation the sandbox forbids: {exc}") from exc
    except (jinja2.exceptions.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
        raise InvalidRequest(
            f"the model's chat template failed on this conversation ({type(exc).__name__}: {exc}); "
            f"check the message roles and fields"
        ) from exc
