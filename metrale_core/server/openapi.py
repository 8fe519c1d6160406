"""The OpenAPI document, generated from the typed records that validate requests.

Owner: every route passes ``operation_class=documented(Model, statuses)`` (or
``body_operation(Model)``, the same with the statuses of a JSON-body route).  Those handlers
read the raw body (so validation errors are OpenAI-shaped 400s naming the path) and therefore
declare no ``data`` parameter; this module documents the body anyway.

Invariants:
- The request schema is msgspec's JSON Schema of the request records (``msgspec.json.schema``),
  never written twice: field types, required fields, ``additionalProperties: false``, numeric
  ranges from ``ranges.BOUNDS`` and string enums (both carried by the fields' ``Meta``).
- Every status a route can answer is documented with OpenAI's error body (``ERROR_STATUSES``
  for JSON-body routes: 400, 401, 404, 413, 415, 500, 503), and nothing it cannot answer.
- A streaming route documents both ``application/json`` and its stream's media type for 200
  (``text/event-stream``; Ollama's routes ``application/x-ndjson``, one JSON object per line).
- A route's 200 JSON body is documented by name from ``openapi_bodies`` (``ok=...``), so the
  schema fuzz checks the bodies, not only the statuses; its OpenAPI links too
  (``openapi_bodies.LINKS``: a created response -> get / delete / continue it), which the
  stateful fuzz follows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Any

import msgspec
from litestar.openapi.spec import Link, OpenAPIMediaType, OpenAPIResponse, Operation, Reference, RequestBody, Schema
from litestar.openapi.spec.enums import OpenAPIType

__all__ = ["ERROR_SCHEMA", "ERROR_STATUSES", "body_operation", "documented", "json_schema"]


def json_schema(tp: Any) -> Schema:
    """The OpenAPI schema of a request record (or any type msgspec can decode), as msgspec
    generates it, with its ``$defs`` inlined."""
    document = msgspec.json.schema(tp)
    defs = document.pop("$defs", {})
    return _schema(_inline(document, defs))


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """``node`` with every ``{"$ref": "#/$defs/X"}`` replaced by ``X`` (the records nest, never
    recursively)."""
    if isinstance(node, list):
        return [_inline(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return _inline(defs[ref.removeprefix("#/$defs/")], defs)
    return {key: _inline(value, defs) for key, value in node.items()}


_SNAKE = re.compile(r"(?<!^)(?=[A-Z])")
#: Keywords whose value is a schema, a list of schemas, or a map of names to schemas.
_ONE, _MANY, _MAP = {"items", "additional_properties"}, {"any_of", "one_of", "all_of"}, {"properties"}


def _schema(node: dict[str, Any]) -> Schema:
    """A JSON Schema object as Litestar's :class:`Schema`."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "required" and not value:
            continue  # msgspec writes an empty list; the document leaves it out
        name = {"not": "schema_not", "if": "schema_if", "else": "schema_else"}.get(key, _SNAKE.sub("_", key).lower())
        if name == "type":
            value = [OpenAPIType(v) for v in value] if isinstance(value, list) else OpenAPIType(value)
        elif name in _ONE and isinstance(value, dict):
            value = _schema(value)
        elif name in _MANY:
            value = [_schema(v) for v in value]
        elif name in _MAP:
            value = {k: _schema(v) for k, v in value.items()}
        out[name] = value
    return Schema(**out)


#: OpenAI's error object.
ERROR_SCHEMA = Schema(
    type=OpenAPIType.OBJECT,
    title="ErrorResponse",
    required=["error"],
    properties={
        "error": Schema(
            type=OpenAPIType.OBJECT,
            required=["message", "type", "param", "code"],
            properties={
                "message": Schema(type=OpenAPIType.STRING),
                "type": Schema(type=OpenAPIType.STRING),
                "param": Schema(one_of=[Schema(type=OpenAPIType.STRING), Schema(type=OpenAPIType.NULL)]),
                "code": Schema(
                    one_of=[
                        Schema(type=OpenAPIType.STRING),
                        Schema(type=OpenAPIType.INTEGER),
                        Schema(type=OpenAPIType.NULL),
                    ]
                ),
            },
        )
    },
)

#: Anthropic's error object (the Messages API's routes answer errors in this shape).
ANTHROPIC_ERROR_SCHEMA = Schema(
    type=OpenAPIType.OBJECT,
    title="AnthropicErrorResponse",
    required=["type", "error"],
    properties={
        "type": Schema(type=OpenAPIType.STRING, enum=["error"]),
        "error": Schema(
            type=OpenAPIType.OBJECT,
            required=["type", "message"],
            properties={"type": Schema(type=OpenAPIType.STRING), "message": Schema(type=OpenAPIType.STRING)},
        ),
    },
)

#: Ollama's error object (the ``/api`` routes answer errors in this shape).
OLLAMA_ERROR_SCHEMA = Schema(
    type=OpenAPIType.OBJECT,
    title="OllamaErrorResponse",
    required=["error"],
    properties={"error": Schema(type=OpenAPIType.STRING)},
)

#: Error shapes by API.
_ERROR_SCHEMAS = {"openai": ERROR_SCHEMA, "anthropic": ANTHROPIC_ERROR_SCHEMA, "ollama": OLLAMA_ERROR_SCHEMA}

_DESCRIPTIONS = {
    400: "Invalid request (the message names the field)",
    401: "Missing or wrong API key",
    403: "Not permitted on this server (the message says what to do instead)",
    404: "Unknown model",
    405: "Method not allowed",
    413: "Request body too large",
    415: "The body is not JSON",
    500: "Server fault (never bad input)",
    501: "Not implemented by this server",
    503: "Loading, shutting down, or at capacity (Retry-After)",
}

#: What a route with a JSON body and the API-key guard can answer besides 200.
ERROR_STATUSES = (400, 401, 404, 413, 415, 500, 503)


def _error_response(status: int, errors: str = "openai") -> OpenAPIResponse:
    return OpenAPIResponse(
        description=_DESCRIPTIONS.get(status, "Error"),
        content={"application/json": OpenAPIMediaType(schema=_ERROR_SCHEMAS[errors])},
    )


@cache
def documented(
    model: type | None = None,
    statuses: tuple[int, ...] = ERROR_STATUSES,
    stream: bool = False,
    errors: str = "openai",
    ok: str | None = None,
) -> type[Operation]:
    """An ``Operation`` class documenting a JSON request body of type ``model`` (if any) and
    exactly the error ``statuses`` the route can answer (plus its 200, whose JSON body is the
    schema ``openapi_bodies.BODIES[ok]`` when ``ok`` names one), with error bodies in the
    ``errors`` API's shape (``"openai"``, ``"anthropic"`` or ``"ollama"``)."""
    from metrale_core.server.openapi_bodies import LINKS, body_schema, stream_schema

    body = body_schema(ok) if ok is not None else None
    links: dict[str, Link | Reference] = {name: Link(**spec) for name, spec in LINKS.get(ok or "", {}).items()}
    media, events = (
        stream_schema(ok) if stream and ok is not None else ("text/event-stream", Schema(type=OpenAPIType.STRING))
    )

    @dataclass
    class DocumentedOperation(Operation):
        def __post_init__(self) -> None:
            if model is not None:
                self.request_body = RequestBody(
                    required=True, content={"application/json": OpenAPIMediaType(schema=json_schema(model))}
                )
            whole = body or Schema(type=OpenAPIType.OBJECT)
            ok_response: OpenAPIResponse | Reference
            if stream:
                ok_response = OpenAPIResponse(
                    description=f'The whole response, or a {media} stream with "stream": true',
                    content={
                        "application/json": OpenAPIMediaType(schema=whole),
                        media: OpenAPIMediaType(schema=events),
                    },
                    links=links or None,
                )
            elif body is not None:
                ok_response = OpenAPIResponse(
                    description="OK", content={"application/json": OpenAPIMediaType(schema=body)}, links=links or None
                )
            else:
                ok_response = (self.responses or {}).get("200") or OpenAPIResponse(description="OK")
            self.responses = {"200": ok_response, **{str(s): _error_response(s, errors) for s in statuses}}

    DocumentedOperation.__name__ = f"{getattr(model, '__name__', 'Route')}Operation"
    return DocumentedOperation


def body_operation(model: type, stream: bool = False, errors: str = "openai", ok: str | None = None) -> type[Operation]:
    """:func:`documented` for a route with a JSON body of type ``model``."""
    return documented(model, ERROR_STATUSES, stream, errors, ok)
