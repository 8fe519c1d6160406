"""OpenAPI request-body schemas for routes that validate their bodies themselves.

Owner: the chat, completions and tokenize routes pass ``operation_class=body_operation(Model)``.
Those handlers read the raw body (so validation errors carry cattrs paths in OpenAI's error
shape) and therefore declare no ``data`` parameter; this module documents the body anyway,
deriving the JSON schema from the same attrs models the converter uses.

Invariant: the schema is generated from the attrs classes in ``schemas``, never written twice.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import attrs
from litestar.openapi.spec.enums import OpenAPIType
from litestar.openapi.spec import OpenAPIMediaType, Operation, RequestBody, Schema

__all__ = ["body_operation", "json_schema"]

_SCALARS = {str: OpenAPIType.STRING, int: OpenAPIType.INTEGER, float: OpenAPIType.NUMBER,
            bool: OpenAPIType.BOOLEAN}


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
        props, required = {}, []
        for f in attrs.fields(tp):
            props[f.name] = json_schema(hints[f.name])
            if f.default is attrs.NOTHING:
                required.append(f.name)
        return Schema(type=OpenAPIType.OBJECT, title=tp.__name__, properties=props,
                      required=required or None, description=(tp.__doc__ or "").strip() or None)
    return Schema()


@lru_cache(maxsize=None)
def body_operation(model: type) -> type[Operation]:
    """An ``Operation`` class that documents a JSON request body of type ``model``."""

    @dataclass
    class BodyOperation(Operation):
        def __post_init__(self) -> None:
            self.request_body = RequestBody(
                required=True,
                content={"application/json": OpenAPIMediaType(schema=json_schema(model))})

    BodyOperation.__name__ = f"{model.__name__}Operation"
    return BodyOperation
