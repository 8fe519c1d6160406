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
- Rendering is bounded: at most ``time_budget_s`` seconds of the rendering thread's own CPU
  time (``time.thread_time``: a template cannot sleep or wait, so CPU time is what a hostile one
  burns, while waiting for the interpreter lock or a core on a busy server is not the
  template's fault and never fails a good request) and at most ``max_chars`` characters
  of output; ``range`` is capped at jinja's ``MAX_RANGE`` and ``*`` / ``+`` / ``**`` refuse to
  build values beyond the output cap.  Past a bound the render raises ``InvalidRequest`` naming
  the template and the bound.  The clock is checked on every call, attribute/item access,
  intercepted operator and output piece, and on every executed line of the compiled template (a
  thread-local ``sys.settrace`` hook that traces only template frames, chaining any tracer
  already set): so a loop with an empty body stops too.  What stays unchecked is one C-level
  operation, each bounded by the size caps (a Python thread cannot be killed; the user guide
  says why the render is not moved to a killable process).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range

from metrale_core.errors import ConfigError, InvalidRequest

__all__ = ["MAX_TEMPLATE_CHARS", "TEMPLATE_TIME_BUDGET_S", "compile_chat_template", "render_chat_template"]

#: Default bounds of one render: seconds, and characters of output.
TEMPLATE_TIME_BUDGET_S = 2.0
MAX_TEMPLATE_CHARS = 16 << 20

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class _TemplateRaised(jinja2.exceptions.TemplateError):
    """What ``raise_exception(msg)`` raises inside a template."""


def _raise_exception(message: str):
    raise _TemplateRaised(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys: bool = False
) -> str:
    # jinja's own tojson escapes HTML characters; transformers' does not
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _OverBudget(Exception):
    """A render went past its time or size bound (raised from the sandbox's hooks)."""


class _Budget:
    def __init__(self, seconds: float, max_chars: int) -> None:
        self.seconds = seconds
        self.deadline = time.thread_time() + seconds
        self.max_chars = max_chars


#: The budget of the render running on this thread (None outside a render).
_current = threading.local()


def _tick() -> None:
    budget = getattr(_current, "budget", None)
    if budget is not None and time.thread_time() > budget.deadline:
        raise _OverBudget(f"it ran longer than its time budget of {budget.seconds:g} s of CPU time")


#: ``co_filename`` of the code jinja compiles from a template string.
_TEMPLATE_FILENAME = "<template>"


def _line_check(frame, event, arg):
    """Local tracer of template frames: the time budget on every executed line."""
    if event == "line":
        _tick()
    return _line_check


def _line_guard(previous):
    """A ``sys.settrace`` function that checks the budget on the lines of template frames and
    hands every other frame to ``previous`` (a debugger's or coverage's tracer), if any."""

    def trace(frame, event, arg):
        if frame.f_code.co_filename == _TEMPLATE_FILENAME:
            return _line_check
        return previous(frame, event, arg) if previous is not None else None

    return trace


def _check_size(n: int) -> None:
    budget = getattr(_current, "budget", None)
    limit = budget.max_chars if budget is not None else MAX_TEMPLATE_CHARS
    if n > limit:
        raise _OverBudget(f"it tried to build a value of {n} items, more than its output cap of {limit} characters")


def _sized(value: Any) -> int | None:
    return len(value) if isinstance(value, (str, list, tuple)) else None


def _bounded_range(*args: int) -> range:
    _tick()
    try:
        return safe_range(*args)
    except OverflowError as exc:
        raise jinja2.exceptions.SecurityError(str(exc)) from None


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox with the cooperative time check and size caps of one render."""

    intercepted_binops = frozenset({"*", "+", "**"})

    def call(__self, __context, __obj, *args, **kwargs):
        _tick()
        return super().call(__context, __obj, *args, **kwargs)

    def getattr(self, obj, attribute):
        _tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj, argument):
        _tick()
        return super().getitem(obj, argument)

    def call_binop(self, context, operator, left, right):
        _tick()
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                n = _sized(seq)
                if n is not None and isinstance(times, int):
                    _check_size(n * times)
        elif operator == "+":
            a, b = _sized(left), _sized(right)
            if a is not None and b is not None:
                _check_size(a + b)
        elif operator == "**" and isinstance(right, int) and abs(right) > 4096:
            raise _OverBudget(f"it raised a number to the power {right}")
        return super().call_binop(context, operator, left, right)


class _TemplateDict:
    """``dict(...)`` for templates without exposing the ``dict`` type itself."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """``namespace(...)`` that refuses underscore attributes (no route to CPython internals)."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _TemplateNamespace._check_name(name)
        _tick()
        if (n := _sized(value)) is not None:
            _check_size(n)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot set underscore attribute {name!r} on a namespace"
            )


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers' assistant-mask marker): renders its body."""

    tags: set[str] = {"generation"}  # noqa: RUF012 -- jinja2 declares Extension.tags an instance attribute

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


@lru_cache(maxsize=16)
def compile_chat_template(template: str) -> jinja2.Template:
    """Compile once per template string; ``ConfigError`` if it is not valid Jinja."""
    env = _BoundedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    env.globals["range"] = _bounded_range
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
        dump = getattr(message, "model_dump", None)
        if callable(dump):
            message = dump()
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
    time_budget_s: float = TEMPLATE_TIME_BUDGET_S,
    max_chars: int = MAX_TEMPLATE_CHARS,
    **template_kwargs: Any,
) -> str:
    """Render ``messages`` (and optional JSON-schema ``tools``) with ``template``.

    ``template_kwargs`` become template variables (``bos_token``, ``eos_token``, ``enable_thinking``, ...).
    The render stops with ``InvalidRequest`` after ``time_budget_s`` seconds or ``max_chars``
    characters of output (see the module invariants).
    """
    compiled = compile_chat_template(template)
    if tools is not None:
        for tool in tools:
            if not isinstance(tool, Mapping):
                raise InvalidRequest(f"tools must be JSON-schema objects, got {type(tool).__name__}")
    variables = {"documents": None, **_plain(template_kwargs)}
    outer = getattr(_current, "budget", None)
    _current.budget = _Budget(time_budget_s, max_chars)
    tracer = sys.gettrace()
    sys.settrace(_line_guard(tracer))
    try:
        pieces, total = [], 0
        for piece in compiled.generate(
            messages=_normalise_messages(messages),
            tools=_plain(list(tools)) if tools is not None else None,
            add_generation_prompt=bool(add_generation_prompt),
            **variables,
        ):
            total += len(piece)
            if total > max_chars:
                raise _OverBudget(f"its output passed the output cap of {max_chars} characters")
            _tick()
            pieces.append(piece)
        return "".join(pieces)
    except _OverBudget as exc:
        raise InvalidRequest(f"the model's chat template was stopped on this conversation: {exc}") from None
    except (RecursionError, MemoryError, OverflowError) as exc:
        raise InvalidRequest(
            f"the model's chat template failed on this conversation ({type(exc).__name__}: {exc})"
        ) from None
    except _TemplateRaised as exc:
        raise InvalidRequest(f"the model's chat template rejected the conversation: {exc.message}") from exc
    except jinja2.exceptions.SecurityError as exc:
        raise InvalidRequest(f"the chat template tried an operation the sandbox forbids: {exc}") from exc
    except (jinja2.exceptions.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
        raise InvalidRequest(
            f"the model's chat template failed on this conversation ({type(exc).__name__}: {exc}); "
            f"check the message roles and fields"
        ) from exc
    finally:
        sys.settrace(tracer)
        _current.budget = outer
