"""A core ``StructuredOutput`` record -> one llguidance grammar (JSON text of its top-level grammar).

Owner: :mod:`metrale_structured.compiler` calls :func:`grammar_text` once per distinct record (the
result is cached with the compiled matcher).  Pure text work: no tokenizer, no model.

Kinds:
- ``json_schema``: llguidance's JSON-Schema grammar (``LLMatcher.grammar_from_json_schema``);
- ``regex``: the whole output matches the pattern; ``choice``: exactly one of the strings;
- ``grammar``: llama.cpp GBNF (``grammar_from("gbnf", ...)``); ``lark``: llguidance Lark;
- ``tool_calls``: the calls in the model's own tool-call wire format (the tool parser's format:
  ``hermes``, ``qwen3_coder``, ``glm47``) with each function's arguments constrained to its
  ``parameters`` schema; one to ``max_calls`` calls (exactly one when ``parallel`` is false;
  unbounded when ``max_calls`` is absent or 0), nothing before or after them.

Invariants: every failure raises :class:`GrammarError` with a message fit for a 400 (which field,
what is wrong); nothing here can loop on user input (all sizes are bounded by the input).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

__all__ = ["TOOL_FORMATS", "GrammarError", "grammar_text"]

#: Tool-call wire formats a forced call can be written in.
TOOL_FORMATS = ("hermes", "qwen3_coder", "glm47")
#: Tags that may be single special tokens (then referenced as tokens, not as text).
_TAGS = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")
_TAG_SPLIT = re.compile("(" + "|".join(re.escape(t) for t in _TAGS) + ")")
_JSON_DEFAULTS = {"whitespace_flexible": False}
#: JSON inside tool calls: the spacing models are trained on (``{"name": "f", "arguments": ...}``).
_CALL_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """The constraint cannot become a grammar (message says why)."""


def _llg():
    import llguidance

    return llguidance


def _lark_string(text: str) -> str:
    """A Lark string literal for ``text`` (JSON escapes are valid Lark escapes)."""
    return json.dumps(text, ensure_ascii=False)


def _lit(text: str, special: Callable[[str], int | None]) -> str:
    """Lark for the literal ``text``; tags that are special tokens become token references."""
    parts = []
    for piece in _TAG_SPLIT.split(text):
        if not piece:
            continue
        token = special(piece) if piece in _TAGS else None
        parts.append(f"<[{token}]>" if token is not None else _lark_string(piece))
    return " ".join(parts) if parts else '""'


def _schema(value: str, field: str) -> Any:
    try:
        schema = json.loads(value)
    except ValueError as exc:
        raise GrammarError(f"{field}: not valid JSON: {exc}") from None
    if not isinstance(schema, (dict, bool)):
        raise GrammarError(f"{field}: a JSON Schema must be an object")
    return schema


def _json_grammar(schema: Any, field: str) -> str:
    try:
        return _llg().LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=_JSON_DEFAULTS)
    except Exception as exc:  # llguidance raises ValueError / RuntimeError with the reason
        raise GrammarError(f"{field}: invalid or unsupported JSON Schema: {exc}") from None


def grammar_text(
    kind: str, value: str, field: str = "response_format", special: Callable[[str], int | None] = lambda text: None
) -> str:
    """The llguidance grammar of one constraint (raises :class:`GrammarError`).

    ``special(text)``: the id when ``text`` is one special token of the tokenizer (tool-call tags
    then become token references, as the model writes them), else None."""
    llg = _llg()
    try:
        if kind == "json_schema":
            return _json_grammar(_schema(value, field), field)
        if kind == "regex":
            return llg.LLMatcher.grammar_from_regex(value)
        if kind == "choice":
            choices = json.loads(value)
            return llg.LLMatcher.grammar_from_lark("start: " + " | ".join(_lark_string(c) for c in choices) + "\n")
        if kind == "grammar":
            return llg.grammar_from("gbnf", value)
        if kind == "lark":
            return llg.LLMatcher.grammar_from_lark(value)
        if kind == "tool_calls":
            return llg.LLMatcher.grammar_from_lark(tool_call_lark(json.loads(value), field, special))
    except GrammarError:
        raise
    except Exception as exc:
        raise GrammarError(f"{field}: the {kind} does not compile: {exc}") from None
    raise GrammarError(f"{field}: unknown constraint kind {kind!r}")


# --- forced tool calls ---------------------------------------------------------------------------


def _params(tool: dict) -> dict:
    """The function's parameters schema; an object without ``additionalProperties`` gets
    ``false`` (as OpenAI's strict mode): the model writes only the declared arguments."""
    params = tool.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(params, dict):
        raise GrammarError(f"tools: function {tool.get('name')!r}: parameters must be an object")
    if params.get("type") == "object" and "additionalProperties" not in params:
        params = {**params, "additionalProperties": False}
    return params


def _json_embed(schema: Any) -> str:
    """``%json {schema}`` with the separators tool-call formats use (``", "``, ``": "``)."""
    if isinstance(schema, dict) and "x-guidance" not in schema:
        schema = {**schema, "x-guidance": _CALL_JSON}
    return "%json " + json.dumps(schema)


def _is_plain_string(schema: Any) -> bool:
    return (
        isinstance(schema, dict)
        and schema.get("type") == "string"
        and not (set(schema) & {"enum", "const", "pattern", "format", "minLength", "maxLength"})
    )


def _raw_pattern(pattern: str) -> str:
    """A JSON-Schema ``pattern`` as a Lark regex over the whole raw value (anchors dropped)."""
    core = pattern[1:] if pattern.startswith("^") else ".*" + pattern
    core = core[:-1] if core.endswith("$") and not core.endswith("\\$") else core + ".*"
    return "(?:" + core.replace("/", "\\/") + ")"


def _value_rule(schema: Any) -> str:
    """A raw-text parameter value (qwen3_coder, glm47): strings as text, others as JSON."""
    if isinstance(schema, dict) and schema.get("type") == "string":
        if "enum" in schema and all(isinstance(v, str) for v in schema["enum"]):
            return " | ".join(_lark_string(v) for v in schema["enum"])
        if "const" in schema and isinstance(schema["const"], str):
            return _lark_string(schema["const"])
        if _is_plain_string(schema):
            return r"/[^<\n]*/"
        if set(schema) <= {"type", "minLength", "maxLength", "description", "title"}:
            low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
            upper = "" if high is None else str(int(high))
            return f"/[^<\\n]{{{low},{upper}}}/"
        if set(schema) <= {"type", "pattern", "description", "title"}:
            return "/" + _raw_pattern(schema["pattern"]) + "/"
    return _json_embed(schema)


def _xml_params(
    params: dict,
    name: str,
    key_open: str,
    key_close: str,
    val_close: str,
    rules: list[str],
    special: Callable[[str], int | None],
) -> str:
    """Rules of a function's parameters in the tag formats: required ones in order, optional
    ones (in order) may be left out; returns the body rule's name."""
    props = params.get("properties") or {}
    required = set(params.get("required") or ())
    parts = []
    for i, (pname, pschema) in enumerate(props.items()):
        rule = f"p_{name}_{i}"
        rules.append(
            f"{rule}: {_lit(key_open + pname + key_close, special)} ({_value_rule(pschema)}) {_lit(val_close, special)}"
        )
        parts.append(rule if pname in required else f"{rule}?")
    body = f"args_{name}"
    rules.append(f"{body}: {' '.join(parts) if parts else chr(34) * 2}")
    return body


def tool_call_lark(
    spec: dict, field: str = "tool_choice", special: Callable[[str], int | None] = lambda text: None
) -> str:
    """The Lark grammar of forced tool calls in ``spec["format"]`` (see the module docstring)."""
    fmt, tools, parallel = spec.get("format"), spec.get("tools") or [], spec.get("parallel", True)
    if fmt not in TOOL_FORMATS:
        raise GrammarError(
            f"{field}: forcing a tool call is not supported for the tool-call "
            f"format {fmt!r} (supported: {', '.join(TOOL_FORMATS)})"
        )
    if not tools:
        raise GrammarError(f"{field}: no tool to call")
    rules: list[str] = []
    calls = []
    for i, tool in enumerate(tools):
        name, params = tool["name"], _params(tool)
        if fmt == "hermes":
            obj = {
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            rules.append(
                f"call_{i}: {_lit('<tool_call>' + NL, special)} {_json_embed(obj)} {_lit(NL + '</tool_call>', special)}"
            )
        elif fmt == "qwen3_coder":
            body = _xml_params(params, str(i), "<parameter=", ">" + NL, NL + "</parameter>" + NL, rules, special)
            rules.append(
                f"call_{i}: {_lit('<tool_call>' + NL + '<function=' + name + '>' + NL, special)} "
                f"{body} {_lit('</function>' + NL + '</tool_call>', special)}"
            )
        else:  # glm47
            body = _xml_params(params, str(i), "<arg_key>", "</arg_key><arg_value>", "</arg_value>", rules, special)
            rules.append(f"call_{i}: {_lit('<tool_call>' + name, special)} {body} {_lit('</tool_call>', special)}")
        calls.append(f"call_{i}")
    rules.insert(0, f"call: {' | '.join(calls)}")
    sep = _lit(NL, special)
    max_calls = int(spec.get("max_calls") or 0)
    if not parallel or max_calls == 1:
        rules.insert(0, "start: call")
    else:
        more = f"{{0,{max_calls - 1}}}" if max_calls > 1 else "*"
        rules.insert(0, f"start: call ({sep} call){more}")
    return "\n".join(rules) + "\n"


NL = "\n"
