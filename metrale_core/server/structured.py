"""A request's structured-output fields -> one core ``StructuredOutput`` record.

Owner: the chat path (``translate.start_chat``) and ``generation.plan_completion`` call it once
per request; the record travels on ``SamplingParams.structured`` to the logit processor that
enforces it (the metrale-structured plugin).  Whether the constraint compiles is checked later, at admission
(``LLMEngine.validate_request`` -> the processor), and refused there with a 400 naming the field.

Accepted (one source per request, else a 400 naming both fields):
- OpenAI ``response_format``: ``text`` (no constraint), ``json_object`` (any JSON object, or
  llama.cpp's ``{"type": "json_object", "schema": {...}}``), ``json_schema`` with
  ``json_schema.schema``;
- vLLM ``structured_outputs``: exactly one of ``json`` (a schema object or its JSON text),
  ``regex``, ``choice`` (a list of strings), ``grammar`` (GBNF), ``json_object: true``;
- llama.cpp ``json_schema`` (a schema object) and ``grammar`` (GBNF; a grammar starting with
  ``%llguidance`` is Lark); both together is a 400 ("Cannot use both json_schema and grammar");
- chat ``tool_choice``: ``"required"`` or a named function forces a call in the model's tool-call
  format (``tool_calls`` kind): a named function exactly once; ``required`` one to
  ``max_tool_calls`` calls (the server's ``--max-tool-calls``, default 8), exactly one when
  ``parallel_tool_calls`` is false.

Invariants: the record's ``value`` is compact JSON for schemas (key order kept: llguidance writes
properties in the schema's order), so equal constraints share one compiled grammar.
"""

from __future__ import annotations

import json
from typing import Any

from metrale_core.sampling.structured import StructuredOutput
from metrale_core.server.errors import APIError

__all__ = ["chat_structured_output", "structured_output", "tool_format"]

_VLLM_KEYS = ("json", "regex", "choice", "grammar", "json_object")


def _schema_text(value: Any, field: str) -> str:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise APIError(400, f"{field}: not valid JSON: {exc}", param=field) from None
    if not isinstance(value, (dict, bool)):
        raise APIError(400, f"{field}: must be a JSON Schema object", param=field)
    return json.dumps(value, separators=(",", ":"))  # key order kept: it is the output's order


def _response_format(rf: Any) -> tuple[str, str, str] | None:
    if rf is None or rf.type == "text":
        return None
    if rf.type == "json_object":
        schema = rf.schema if rf.schema is not None else {"type": "object"}
        return "json_schema", _schema_text(schema, "response_format.schema"), "response_format"
    if rf.type == "json_schema":
        spec = rf.json_schema
        if not isinstance(spec, dict) or "schema" not in spec:
            raise APIError(
                400,
                "response_format.json_schema.schema: required for type 'json_schema'",
                param="response_format.json_schema.schema",
            )
        return (
            "json_schema",
            _schema_text(spec["schema"], "response_format.json_schema.schema"),
            "response_format.json_schema",
        )
    raise APIError(
        400,
        f"response_format.type: must be 'text', 'json_object' or 'json_schema', got {rf.type!r}",
        param="response_format.type",
    )


def _vllm(so: dict[str, Any] | None) -> tuple[str, str, str] | None:
    if so is None:
        return None
    given = [k for k in so if so[k] is not None and so[k] is not False]
    for key in given:
        if key not in _VLLM_KEYS:
            raise APIError(
                400,
                f"structured_outputs.{key}: not supported (supported: {', '.join(_VLLM_KEYS)})",
                param=f"structured_outputs.{key}",
            )
    if len(given) != 1:
        raise APIError(
            400,
            f"structured_outputs: give exactly one of {', '.join(_VLLM_KEYS)} (got {', '.join(given) or 'none'})",
            param="structured_outputs",
        )
    key = given[0]
    field, value = f"structured_outputs.{key}", so[key]
    if key == "json":
        return "json_schema", _schema_text(value, field), field
    if key == "json_object":
        return "json_schema", _schema_text({"type": "object"}, field), field
    if key == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise APIError(400, f"{field}: must be a non-empty list of strings", param=field)
        return "choice", json.dumps(value), field
    if not isinstance(value, str) or not value.strip():
        raise APIError(400, f"{field}: must be a non-empty string", param=field)
    return ("regex" if key == "regex" else "grammar"), value, field


def _llama_cpp(req: Any) -> tuple[str, str, str] | None:
    schema, grammar = getattr(req, "json_schema", None), getattr(req, "grammar", None)
    if schema is not None and grammar is not None:
        raise APIError(400, "json_schema, grammar: Cannot use both json_schema and grammar", param="grammar")
    if schema is not None:
        return "json_schema", _schema_text(schema, "json_schema"), "json_schema"
    if grammar is not None:
        if not grammar.strip():
            raise APIError(400, "grammar: must be a non-empty GBNF grammar", param="grammar")
        kind = "lark" if grammar.lstrip().startswith("%llguidance") else "grammar"
        return kind, grammar, "grammar"
    return None


def tool_format(host: Any) -> str:
    """The tool-call wire format the server parses: ``--tool-call-parser``, else the format the
    chat template asks for, else the parser registered for the model type, else ``hermes``
    (as ``make_stream_parser`` picks it)."""
    from metrale_core.streamparse.parser import default_tool_parser

    name = host.config.tool_call_parser
    if name:
        return name
    model_type = host.served.model_type if host.served is not None else None
    registry = host.registry
    if registry is not None:
        types = {n: tuple(s.model_types) for n, s in registry.tool_call_parsers.items()}
    else:
        from metrale_core.streamparse import BUILTIN_TOOL_PARSERS

        types = {n: t for n, (_, t) in BUILTIN_TOOL_PARSERS.items()}
    return default_tool_parser(types, model_type, served_chat_template(host))


def served_chat_template(host: Any) -> str | None:
    """The served tokenizer's chat template text, if any."""
    tokenizer = host.served.tokenizer if host.served is not None else None
    template = getattr(tokenizer, "chat_template", None)
    return template if isinstance(template, str) else None


def _forced_tools(req: Any, tools: list[dict] | None, fmt: str | None, max_calls: int) -> tuple[str, str, str] | None:
    choice = getattr(req, "tool_choice", None)
    if not tools or choice is None or choice in ("none", "auto"):
        return None
    chosen = tools if choice == "required" else [t for t in tools if t["function"]["name"] == choice.function.name]
    value = {
        "format": fmt or "hermes",
        "tools": [{"name": t["function"]["name"], "parameters": t["function"]["parameters"]} for t in chosen],
        # a named function is called once; "required" allows several unless parallel is off
        "parallel": choice == "required" and getattr(req, "parallel_tool_calls", None) is not False,
        # the bound on a parallel list: without one a model repeating its call fills the context
        "max_calls": max_calls,
    }
    return "tool_calls", json.dumps(value), "tool_choice"


def structured_output(
    req: Any,
    *,
    tools: list[dict] | None = None,
    tool_fmt: str | None = None,
    reasoning: bool = False,
    starts_in_reasoning: bool = False,
    max_tool_calls: int = 8,
) -> StructuredOutput | None:
    """The request's constraint, or None; a 400 naming the field for a malformed one.

    ``tools`` are the request's template tools and ``tool_fmt`` the tool-call format (chat only);
    ``reasoning``: a reasoning format applies, so the constraint starts after ``</think>``
    (``starts_in_reasoning``: the prompt already opened ``<think>``); ``max_tool_calls`` bounds
    the calls of a forced ``required`` turn.
    """
    sources = [
        (s[2], s)
        for s in (
            _response_format(getattr(req, "response_format", None)),
            _vllm(getattr(req, "structured_outputs", None)),
            _llama_cpp(req),
            _forced_tools(req, tools, tool_fmt, max_tool_calls),
        )
        if s
    ]
    if not sources:
        return None
    if len(sources) > 1:
        names = " and ".join(name for name, _ in sources)
        raise APIError(400, f"{names}: give one output constraint per request", param=sources[1][0])
    kind, value, field = sources[0][1]
    return StructuredOutput(
        kind=kind,
        value=value,
        field=field,
        reasoning_end="</think>" if reasoning else None,
        starts_in_reasoning=reasoning and starts_in_reasoning,
        reasoning_start="<think>" if reasoning else None,
    )


def chat_structured_output(host: Any, req: Any, prompt_text: str) -> StructuredOutput | None:
    """:func:`structured_output` of a chat request: its tools, the served tool-call and reasoning
    formats.  A forced tool call (``tool_choice`` required / named) is only a constraint when a
    structured-output processor is installed; without one it is parsed like ``auto``."""
    from metrale_core.server.chat_prompt import reasoning_format, template_tools, wants_tool_parsing

    tools = template_tools(req) if wants_tool_parsing(req) else None
    pipeline = host.ready().engine.output_processor.pipeline
    if tools and not getattr(pipeline, "handles_structured_output", False):
        tools = None
    thinking = reasoning_format(host) is not None and not prompt_text.rstrip().endswith("</think>")
    return structured_output(
        req,
        tools=tools,
        tool_fmt=tool_format(host) if tools else None,
        reasoning=thinking,
        starts_in_reasoning=prompt_text.rstrip().endswith("<think>"),
        max_tool_calls=host.config.max_tool_calls,
    )
