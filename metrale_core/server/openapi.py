"""The OpenAPI document, generated from the typed records that validate requests.

Owner: every route passes ``operation_class=documented(Model, statuses)`` (or
``body_operation(Model)``, the same with the statuses of a JSON-body route).  Those handlers
read the raw body (so validation errors carry cattrs paths in OpenAI's error shape) and
therefore declare no ``data`` parameter; this module documents the body anyway.

Invariants:
- The request schema is derived from the attrs classes in ``schemas``, never written twice:
  field types, required fields, numeric ranges from ``schemas.BOUNDS`` (``minimum``,
  ``maximum``, ``exclusiveMinimum`` ...) and string enums from the fields' ``enum`` metadata.
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

import types
import typing
from dataclasses import dataclass
from functools import cache
from typing import Any

import attrs
from litestar.openapi.spec import Link, OpenAPIMediaType, OpenAPIResponse, Operation, Reference, RequestBody, Schema
from litestar.openapi.spec.enums import OpenAPIType

__all__ = ["ERROR_SCHEMA", "ERROR_STATUSES", "body_operation", "documented", "json_schema"]

_SCALARS = {str: OpenAPIType.STRING, int: OpenAPIType.INTEGER, float: OpenAPIType.NUMBER, bool: OpenAPIType.BOOLEAN}


def json_schema(tp: Any) -> Schema:
    """The OpenAPI schema of a type used in the request models."""
    if tp in _SCALARS:
        return Schema(type=_SCALARS[tp])
    if tp is Any or tp is None or tp is type(None):
        return Schema() if tp is Any else Schema(type=OpenAPIType.NULL)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return Schema(one_of=[json_schema(a) for a in args])
    if origin is list:
        return Schema(type=OpenAPIType.ARRAY, items=json_schema(args[0]))
    if origin is dict or tp is dict:
        value = json_schema(args[1]) if len(args) == 2 else Schema()
        return Schema(type=OpenAPIType.OBJECT, additional_properties=value)
    if attrs.has(tp):
        hints = typing.get_type_hints(tp)
        props: dict[str, Schema | Reference] = {}
        required: list[str] = []
        for f in attrs.fields(tp):
            props[f.name] = _constrained(json_schema(hints[f.name]), f)
            if f.default is attrs.NOTHING:
                required.append(f.name)
        return Schema(
            type=OpenAPIType.OBJECT,
            title=tp.__name__,
            properties=props,
            required=required or None,
            # the request records are read with forbid_extra_keys: an unknown field is a 400
            additional_properties=False,
            description=(tp.__doc__ or "").strip() or None,
        )
    return Schema()


def _constrained(schema: Schema, f: Any) -> Schema:
    """``schema`` of attrs field ``f`` with its enum and numeric bounds."""
    from metrale_core.server.schemas import BOUNDS

    enum = f.metadata.get("enum")
    if enum and schema.type == OpenAPIType.STRING:
        schema.enum = list(enum)
    bound = BOUNDS.get(f.name)
    if bound is None:
        return schema
    targets = [schema] + [s for s in schema.one_of or [] if isinstance(s, Schema)]  # json_schema builds no Reference
    for sub in targets:
        if not isinstance(sub.type, OpenAPIType) or sub.type not in (OpenAPIType.INTEGER, OpenAPIType.NUMBER):
            continue
        if bound.low is not None:
            if bound.low_open:
                sub.exclusive_minimum = bound.low
            else:
                sub.minimum = bound.low
        if bound.high is not None:
            if bound.high_open:
                sub.exclusive_maximum = bound.high
            else:
                sub.maximum = bound.high
    return schema


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
