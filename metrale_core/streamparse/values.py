"""Parameter values of the XML-style formats (qwen3_coder, glm47) as streamed JSON text.

Owner: ``TagParserBase`` builds one :class:`ArgsObjectWriter` per call; the XML parsers feed it
the raw text of each parameter body.

The model writes values raw (``<parameter=n>\\n42\\n</parameter>``); the request's tool schema
says what they are.  A parameter whose schema type is a string type (or that the schema does not
list, or has no type) streams as a JSON string fragment by fragment.  Any other type is buffered
until the body closes, then converted the way vLLM does: ``null``; ``integer`` via ``int``;
``number`` via ``json.loads``; ``boolean`` from true/false; anything else via ``json.loads``, then
``ast.literal_eval``.  A value that does not convert is kept as a JSON string: nothing is dropped.

Invariants:
- The fragments of one writer concatenate to one JSON object (``json.loads`` accepts it) once
  :meth:`ArgsObjectWriter.close` was called.
- A string value that is exactly ``null`` becomes JSON ``null`` (vLLM's rule); to decide that,
  at most the first four characters of a string body are held back.
"""

from __future__ import annotations

import ast
import json

from loguru import logger

__all__ = ["ArgsObjectWriter", "convert_value", "index_tools", "schema_type"]

STRING_TYPES = frozenset({"string", "str", "text", "varchar", "char", "enum"})
INTEGER_TYPES = frozenset({"integer", "int", "int32", "int64", "long", "uint"})
NUMBER_TYPES = frozenset({"number", "float", "double", "num"})
BOOLEAN_TYPES = frozenset({"boolean", "bool", "binary"})


def index_tools(tools: list[dict] | None) -> dict[str, dict[str, dict]]:
    """OpenAI ``tools`` -> {function name: {parameter name: parameter schema}}.

    Entries that do not look like function tools are skipped (the server validates requests).
    """
    out: dict[str, dict[str, dict]] = {}
    for tool in tools or ():
        if not isinstance(tool, dict):
            continue
        fn = tool.get("function", tool)
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            continue
        params = fn.get("parameters") or {}
        props = params.get("properties") if isinstance(params, dict) else None
        if not isinstance(props, dict):  # a malformed schema types nothing (never a crash)
            props = {}
        out[fn["name"]] = {k: v for k, v in props.items() if isinstance(v, dict)}
    return out


def schema_type(schema: dict | None) -> str:
    """The JSON-schema type of a parameter, lower-cased; ``"string"`` when unknown."""
    if not schema:
        return "string"
    typ = schema.get("type")
    if isinstance(typ, list):  # ["integer", "null"]: the first non-null type
        typ = next((t for t in typ if t != "null"), "null")
    if typ is None:  # untyped (anyOf, enum, ...): vLLM keeps such values as strings
        return "object" if "properties" in schema else "string"
    return typ.strip().lower() if isinstance(typ, str) else "object"


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def convert_value(raw: str, typ: str) -> str:
    """The JSON text of a non-string parameter value written raw by the model."""
    text = raw.strip()
    if text == "null":
        return "null"
    try:
        if typ in INTEGER_TYPES:
            return _dumps(int(text))
        if typ in NUMBER_TYPES:
            value = json.loads(text)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return _dumps(value)
            raise ValueError(f"{text!r} is not a number")
        if typ in BOOLEAN_TYPES:
            if text.lower() in ("true", "false"):
                return "true" if text.lower() == "true" else "false"
            raise ValueError(f"{text!r} is not a boolean")
        try:
            return _dumps(json.loads(text))
        except ValueError:
            return _dumps(ast.literal_eval(text))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        logger.debug("parameter value {!r} is not a valid {} ({}); kept as a string", raw, typ, exc)
        return _dumps(raw)


class ArgsObjectWriter:
    """Writes one call's arguments object as JSON text fragments, parameter by parameter."""

    def __init__(self, schema: dict[str, dict]) -> None:
        self.schema = schema
        self._count = 0
        self._typ: str | None = None
        self._streaming = False
        self._held: list[str] = []  # non-string body, or the first chars of a string body
        self._opened = False  # the string's opening quote was written

    def begin(self, key: str) -> str:
        """Start parameter ``key``: returns ``{"key": `` (or ``, "key": ``)."""
        self._typ = schema_type(self.schema.get(key))
        self._streaming = self._typ in STRING_TYPES
        self._held, self._opened = [], False
        sep = "{" if self._count == 0 else ", "
        self._count += 1
        return f"{sep}{_dumps(key)}: "

    def add(self, raw: str) -> str:
        """More raw body text; returns the JSON fragment it completes (possibly ``""``)."""
        if not raw:
            return ""
        if not self._streaming or not self._opened:
            self._held.append(raw)
            if not self._streaming:
                return ""
            held = "".join(self._held)
            if "null".startswith(held):
                return ""
            self._held, self._opened = [], True
            return '"' + _dumps(held)[1:-1]
        return _dumps(raw)[1:-1]

    def end(self) -> str:
        """The body closed; returns the fragment that ends the value."""
        held = "".join(self._held)
        self._held = []
        if not self._streaming:
            return convert_value(held, self._typ or "string")
        if self._opened:
            return '"'
        return "null" if held == "null" else _dumps(held)

    def close(self) -> str:
        """End the object: ``}`` (``{}`` when it had no parameter)."""
        return "}" if self._count else "{}"
