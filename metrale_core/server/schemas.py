"""Request models of the OpenAI-compatible API and the one converter that validates them.

Owner: the server routes call :func:`parse_body` on the raw request body; everything after
that works on these frozen attrs records.

Invariants:
- One private cattrs converter with ``forbid_extra_keys``: a field OpenAI does not document
  (nor the vLLM extensions listed here) is a 400 naming its path (``messages[0].foo: unknown
  field``); documented fields are all accepted.
- Scalar types are strict, as JSON is: ``"2"`` is not an integer, ``true`` is not a number;
  ``2.0`` is the integer 2, as JSON Schema (and the OpenAPI document) count integers.
- Every error message starts with the path of the offending value (``messages[1].role: ...``);
  :class:`~metrale_core.server.errors.APIError` carries the first path as ``param``.
- Range checks (``temperature`` in [0, 2], ``n`` >= 1, ...) live in :func:`check_ranges`, one
  table shared by chat and completions.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import cattrs
import cattrs.cols
from attrs import field, fields, frozen
from attrs import has as attrs_has
from cattrs.errors import (
    AttributeValidationNote,
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
    IterableValidationNote,
)
from cattrs.gen import make_dict_structure_fn

from metrale_core.server.errors import APIError
from metrale_core.server.guards import MAX_JSON_DEPTH, MAX_LOGIT_BIAS, MAX_STOP, MAX_STOP_CHARS, check_json

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "ContentPart",
    "DetokenizeRequest",
    "FunctionDef",
    "NamedToolChoice",
    "ResponseFormat",
    "StreamOptions",
    "TokenizeRequest",
    "Tool",
    "ToolCall",
    "check_ranges",
    "parse_body",
]

ROLES = ("system", "developer", "user", "assistant", "tool")


def one_of(*values: str, default: Any = ...) -> Any:
    """A string field whose allowed values the OpenAPI document lists (``enum``); the routes
    check them with messages naming the field."""
    if default is ...:
        return field(metadata={"enum": values})
    return field(default=default, metadata={"enum": values})


# --- leaf records ----------------------------------------------------------------------------


@frozen(kw_only=True)
class ContentPart:
    """One part of a message's content; only ``text`` parts can be served."""

    type: str = one_of("text", "refusal", "image_url", "input_audio", "file")
    text: str | None = None
    image_url: dict[str, Any] | None = None
    input_audio: dict[str, Any] | None = None
    file: dict[str, Any] | None = None
    refusal: str | None = None


@frozen(kw_only=True)
class FunctionCall:
    name: str
    arguments: str


@frozen(kw_only=True)
class ToolCall:
    """A tool call in an assistant message of the conversation history."""

    id: str
    function: FunctionCall
    type: str = one_of("function", default="function")
    index: int | None = None


Content = str | list[ContentPart] | None


@frozen(kw_only=True)
class ChatMessage:
    role: str = one_of(*ROLES)
    content: Content = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    #: Earlier reasoning of an assistant turn (passed to the template; vLLM extension).
    reasoning_content: str | None = None
    refusal: str | None = None
    function_call: dict[str, Any] | None = None
    audio: dict[str, Any] | None = None


@frozen(kw_only=True)
class FunctionDef:
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


@frozen(kw_only=True)
class Tool:
    type: str = one_of("function")
    function: FunctionDef


@frozen(kw_only=True)
class NamedFunction:
    name: str


@frozen(kw_only=True)
class NamedToolChoice:
    type: str = one_of("function")
    function: NamedFunction


ToolChoice = str | NamedToolChoice | None


@frozen(kw_only=True)
class StreamOptions:
    include_usage: bool = False
    include_obfuscation: bool | None = None
    #: vLLM extension: a usage object on every chunk.
    continuous_usage_stats: bool = False


@frozen(kw_only=True)
class ResponseFormat:
    type: str
    json_schema: dict[str, Any] | None = None
    #: llama.cpp: ``{"type": "json_object", "schema": {...}}``.
    schema: dict[str, Any] | None = None


Stop = str | list[str] | None
#: A string, token ids, or a batch of either.
Prompt = str | list[int] | list[str] | list[list[int]]


# --- requests --------------------------------------------------------------------------------


@frozen(kw_only=True)
class _SamplingRequest:
    """Fields chat and completions share (OpenAI's, then vLLM's extensions)."""

    model: str | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    max_tokens: int | None = None
    n: int = 1
    seed: int | None = None
    stop: Stop = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    # vLLM extensions
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    #: Structured output (``metrale_core.server.structured``): vLLM's object, llama.cpp's fields.
    structured_outputs: dict[str, Any] | None = None
    json_schema: dict[str, Any] | None = None
    grammar: str | None = None


@frozen(kw_only=True)
class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage]
    logprobs: bool = False
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice = None
    parallel_tool_calls: bool | None = None
    # documented OpenAI fields that change nothing here
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    # documented OpenAI fields this server cannot honour (a non-empty value is a 400)
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    # vLLM extensions
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    #: At most this many reasoning tokens, then ``</think>`` is forced (``server.thinking_budget``).
    thinking_token_budget: int | None = None


@frozen(kw_only=True)
class CompletionRequest(_SamplingRequest):
    prompt: Prompt
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None
    response_format: ResponseFormat | None = None


@frozen(kw_only=True)
class TokenizeRequest:
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None


@frozen(kw_only=True)
class DetokenizeRequest:
    tokens: list[int]
    model: str | None = None


# --- the converter ---------------------------------------------------------------------------


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, dict) else type(value).__name__


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_integral(v: Any) -> bool:
    """An integer as JSON Schema counts them: ``3`` or ``3.0`` (not ``true``, not ``3.5``)."""
    return _is_int(v) or (isinstance(v, float) and v.is_integer())


def _strict(check: Callable[[Any], bool], what: str, convert: Callable = lambda v: v):
    def hook(value: Any, _type: Any) -> Any:
        if not check(value):
            raise TypeError(f"must be {what}, got {_kind(value)}")
        return convert(value)

    return hook


def _union_hook(conv: cattrs.Converter, arms: dict[str, Any], what: str):
    """Structure a union by the JSON kind of the value: arms maps 'str'|'list'|'dict' to a type."""

    def hook(value: Any, _type: Any) -> Any:
        if value is None and "null" in arms:
            return None
        kind = (
            "str"
            if isinstance(value, str)
            else "list"
            if isinstance(value, list)
            else "dict"
            if isinstance(value, dict)
            else None
        )
        if kind not in arms:
            raise TypeError(f"must be {what}, got {_kind(value)}")
        return conv.structure(value, arms[kind])

    return hook


def _prompt_hook(value: Any, _type: Any) -> Any:
    what = "a string, an array of token ids, or an array of either"
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        raise TypeError(f"must be {what} (non-empty), got {_kind(value)}")
    if all(_is_int(v) for v in value):
        return list(value)
    if all(isinstance(v, str) for v in value):
        return list(value)
    if all(isinstance(v, list) and v and all(_is_int(t) for t in v) for v in value):
        return [list(v) for v in value]
    raise TypeError(f"must be {what}; mixed or empty items are not accepted")


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    conv.register_structure_hook(str, _strict(lambda v: isinstance(v, str), "a string"))
    conv.register_structure_hook(int, _strict(_is_integral, "an integer", int))
    conv.register_structure_hook(float, _strict(lambda v: _is_int(v) or isinstance(v, float), "a number", float))
    conv.register_structure_hook(bool, _strict(lambda v: isinstance(v, bool), "true or false"))
    conv.register_structure_hook_func(
        lambda t: t == dict[str, Any], _strict(lambda v: isinstance(v, dict), "an object", dict)
    )

    def dict_of_float(value: Any, _type: Any) -> dict[str, float]:
        if not isinstance(value, dict):
            raise TypeError(f"must be an object, got {_kind(value)}")
        bad = [k for k, v in value.items() if not (_is_int(v) or isinstance(v, float))]
        if bad:
            raise TypeError(f"value of {bad[0]!r} must be a number")
        return {k: float(v) for k, v in value.items()}

    conv.register_structure_hook_func(lambda t: t == dict[str, float], dict_of_float)

    list_factory = cattrs.cols.list_structure_factory

    def strict_list(type_: Any) -> Callable:
        base = list_factory(type_, conv)

        def hook(value: Any, _t: Any) -> list:
            if not isinstance(value, list):
                raise TypeError(f"must be an array, got {_kind(value)}")
            return base(value, _t)

        return hook

    conv.register_structure_hook_factory(lambda t: getattr(t, "__origin__", None) is list, strict_list)

    def strict_record(type_: Any) -> Callable:
        base = make_dict_structure_fn(type_, conv)

        def hook(value: Any, _t: Any) -> Any:
            if not isinstance(value, dict):
                raise TypeError(f"must be an object, got {_kind(value)}")
            return base(value, _t)

        return hook

    conv.register_structure_hook_factory(attrs_has, strict_record)
    conv.register_structure_hook(
        Content,
        _union_hook(
            conv, {"null": None, "str": str, "list": list[ContentPart]}, "a string or an array of content parts"
        ),
    )
    conv.register_structure_hook(
        Stop, _union_hook(conv, {"null": None, "str": str, "list": list[str]}, "a string or an array of strings")
    )
    conv.register_structure_hook(
        ToolChoice,
        _union_hook(
            conv,
            {"null": None, "str": str, "dict": NamedToolChoice},
            '\'none\', \'auto\', \'required\' or {"type": "function", "function": {"name": ...}}',
        ),
    )
    conv.register_structure_hook(
        str | dict[str, Any] | None,
        _union_hook(conv, {"null": None, "str": str, "dict": dict[str, Any]}, "a string or an object"),
    )
    conv.register_structure_hook(Prompt, _prompt_hook)
    return conv


_CONVERTER = _make_converter()


# --- error paths -----------------------------------------------------------------------------


def _join(path: str, part: str | int) -> str:
    if isinstance(part, int):
        return f"{path}[{part}]"
    return f"{path}.{part}" if path else part


def _flatten(exc: BaseException, path: str) -> list[tuple[str, str]]:
    """``(path, message)`` for every leaf error of a cattrs exception tree."""
    if isinstance(exc, ForbiddenExtraKeysError):
        return [(_join(path, key), "unknown field") for key in sorted(exc.extra_fields)]
    if isinstance(exc, (ClassValidationError, IterableValidationError)):
        with_notes, without = exc.group_exceptions()
        out: list[tuple[str, str]] = []
        for sub, note in with_notes:
            if isinstance(note, AttributeValidationNote):
                sub_path = _join(path, note.name)
            elif isinstance(note, IterableValidationNote):
                sub_path = _join(path, note.index)
            else:
                sub_path = path
            out += _flatten(sub, sub_path)
        for sub in without:
            out += _flatten(sub, path)
        return out
    if isinstance(exc, KeyError):
        return [(path, "field required")]
    return [(path, str(exc) or type(exc).__name__)]


def _validation_error(pairs: list[tuple[str, str]]) -> APIError:
    shown = [f"{p or 'body'}: {m}" for p, m in pairs[:5]]
    more = f" (and {len(pairs) - 5} more)" if len(pairs) > 5 else ""
    return APIError(400, "; ".join(shown) + more, param=pairs[0][0] or None)


def parse_body(body: bytes, cls: type) -> Any:
    """Decode a JSON body into ``cls``; :class:`APIError` 400 with the error paths otherwise."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise APIError(400, f"the request body is nested deeper than {MAX_JSON_DEPTH} levels") from None
    if not isinstance(data, dict):
        raise APIError(400, f"the request body must be a JSON object, got {_kind(data)}")
    check_json(data)
    # OpenAI documents most optional fields as nullable: a top-level null means "the default"
    data = {key: value for key, value in data.items() if value is not None}
    try:
        return _CONVERTER.structure(data, cls)
    except Exception as exc:
        raise _validation_error(_flatten(exc, "")) from None


# --- ranges ----------------------------------------------------------------------------------


@frozen
class Bound:
    """The allowed range of a numeric request field (``None``: unbounded on that side)."""

    low: float | None = None
    high: float | None = None
    #: The low end itself is excluded (``top_p`` > 0).
    low_open: bool = False
    #: The high end itself is excluded (``seed`` < 2**64).
    high_open: bool = False
    text: str = ""

    def ok(self, value: Any) -> bool:
        if isinstance(value, bool):
            return True
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))


#: field -> bound, for the numeric fields of every request kind; one table for the checks
#: (:func:`check_ranges`) and the OpenAPI document (``openapi``).
BOUNDS: dict[str, Bound] = {
    "temperature": Bound(0, 2, text="must be between 0 and 2"),
    "top_p": Bound(0, 1, low_open=True, text="must be in (0, 1]"),
    "top_k": Bound(-1, None, text="must be >= 0 (0 or -1 disables it)"),
    "min_p": Bound(0, 1, text="must be between 0 and 1"),
    "frequency_penalty": Bound(-2, 2, text="must be between -2 and 2"),
    "presence_penalty": Bound(-2, 2, text="must be between -2 and 2"),
    "repetition_penalty": Bound(0, 10, low_open=True, text="must be in (0, 10]"),
    "max_tokens": Bound(1, None, text="must be >= 1"),
    "max_completion_tokens": Bound(1, None, text="must be >= 1"),
    "n": Bound(1, 128, text="must be between 1 and 128"),
    "best_of": Bound(1, 128, text="must be between 1 and 128"),
    "top_logprobs": Bound(0, 20, text="must be between 0 and 20"),
    "logprobs": Bound(0, 20, text="must be between 0 and 20"),
    "seed": Bound(-(1 << 63), 1 << 64, high_open=True, text="must fit in 64 bits"),
    "thinking_token_budget": Bound(0, None, text="must be >= 0"),
}


def check_ranges(request: Any) -> None:
    """Raise a 400 naming every numeric field of ``request`` outside its allowed range."""
    problems = []
    for f in fields(type(request)):
        bound = BOUNDS.get(f.name)
        value = getattr(request, f.name)
        if bound is not None and value is not None and not bound.ok(value):
            problems.append((f.name, f"{bound.text}, got {value!r}"))
    logit_bias = getattr(request, "logit_bias", None) or {}
    if len(logit_bias) > MAX_LOGIT_BIAS:
        problems.append(("logit_bias", f"at most {MAX_LOGIT_BIAS} entries, got {len(logit_bias)}"))
        logit_bias = {}
    stop = getattr(request, "stop", None)
    stops = [stop] if isinstance(stop, str) else list(stop or ())
    if len(stops) > MAX_STOP:
        problems.append(("stop", f"at most {MAX_STOP} stop strings, got {len(stops)}"))
    for i, text in enumerate(stops[:MAX_STOP]):
        if len(text) > MAX_STOP_CHARS:
            problems.append(
                (
                    f"stop[{i}]" if not isinstance(stop, str) else "stop",
                    f"at most {MAX_STOP_CHARS} characters, got {len(text)}",
                )
            )
    for key, bias in logit_bias.items():
        if not key.lstrip("-").isdigit():
            problems.append((f"logit_bias.{key}", "keys must be token ids (integers as strings)"))
        elif not -100.0 <= bias <= 100.0:
            problems.append((f"logit_bias.{key}", f"must be between -100 and 100, got {bias}"))
    if problems:
        raise _validation_error(problems)
