"""Decode a JSON request body into its typed record: one msgspec decode validates it.

Owner: every route with a JSON body (``common.read_request`` calls :func:`parse_body` on a
frontend worker thread); the request records subclass :class:`Body` (a whole body) and
:class:`Record` (its parts).

Invariants:
- A valid body costs one strict ``msgspec.json.decode`` into its record (``"2"`` is not an
  integer, ``true`` is not a number), then a walk of the record for the JSON guards
  (``guards.check_json``: nesting depth, lone surrogates) and ``ranges.check_ranges``.
- Unknown fields are a 400 naming their path (``messages[0].foo: unknown field``); every
  message starts with the path of the offending value (``messages[1].role: ...``) and
  :class:`~metrale_core.server.errors.APIError` carries that path as ``param``.  A union
  field's ``Meta`` description says what it must be.
- Two leniencies of the API are kept: a top-level ``null`` means the field's default (OpenAI
  documents most optional fields as nullable), and ``2.0`` is the integer 2 (as JSON Schema, and
  the OpenAPI document, count integers).  A body that needs one fails the strict decode and
  takes the slow path, once: parsed into plain JSON values, guarded, normalised along the
  record's types and converted; the same path words the 400 of a body that is invalid.
"""

from __future__ import annotations

import json
import re
import types
import typing
from functools import cache
from typing import Annotated, Any, TypeVar

import msgspec

from metrale_core.server.errors import APIError
from metrale_core.server.guards import MAX_JSON_DEPTH, check_json, join_path
from metrale_core.server.ranges import check_ranges, validation_error

__all__ = ["Body", "Record", "parse_body"]


class Record(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """A part of a request body: immutable, and an unknown field is a 400."""


class Body(Record, frozen=True):
    """A whole request body (what :func:`parse_body` decodes)."""


R = TypeVar("R", bound=Body)


def parse_body(body: bytes, cls: type[R]) -> R:
    """Decode a JSON body into ``cls``; :class:`APIError` 400 with the error path otherwise."""
    try:
        record = _decoder(cls).decode(body)
    except msgspec.ValidationError:
        record = _slow_path(_plain(body), cls)
    except msgspec.DecodeError as exc:
        _plain(body)  # raises today's message when the JSON module can say what is wrong
        raise APIError(400, f"the request body is not valid JSON: {exc}") from None
    check_json(record)
    check_ranges(record)
    return record


@cache
def _decoder(cls: type[R]) -> msgspec.json.Decoder[R]:
    """The strict decoder of ``cls`` (built once per record type)."""
    return msgspec.json.Decoder(cls, strict=True)


def _plain(body: bytes) -> dict[str, Any]:
    """``body`` as plain JSON values, guarded; a 400 saying why it cannot be a request."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise APIError(400, f"the request body is nested deeper than {MAX_JSON_DEPTH} levels") from None
    if not isinstance(data, dict):
        raise APIError(400, f"the request body must be a JSON object, got {_kind(data)}")
    check_json(data)
    return data


def _slow_path(data: dict[str, Any], cls: type[R]) -> R:
    """``data`` with the two leniencies applied, converted to ``cls``; the 400 if it fails."""
    data = _lenient({key: value for key, value in data.items() if value is not None}, cls)
    try:
        return msgspec.convert(data, cls, strict=True)
    except msgspec.ValidationError as exc:
        raise validation_error([_explain(str(exc), cls)]) from None


# --- leniency: integral floats where integers are expected ----------------------------------


def _strip(tp: Any) -> Any:
    return typing.get_args(tp)[0] if typing.get_origin(tp) is Annotated else tp


def _arms(tp: Any) -> list[Any]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [_strip(arm) for arm in typing.get_args(tp)]
    return [tp]


def _is_record(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, msgspec.Struct)


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def _lenient(value: Any, tp: Any) -> Any:
    """``value`` with each integral float that ``tp`` expects as an integer made an ``int``."""
    arms = _arms(_strip(tp))
    if isinstance(value, float):
        return int(value) if value.is_integer() and int in arms and float not in arms else value
    for arm in arms:
        origin = typing.get_origin(arm)
        if isinstance(value, list) and origin is list:
            return [_lenient(item, typing.get_args(arm)[0]) for item in value]
        if isinstance(value, dict) and origin is dict:
            return {key: _lenient(item, typing.get_args(arm)[1]) for key, item in value.items()}
        if isinstance(value, dict) and _is_record(arm):
            hints = _hints(arm)
            return {key: _lenient(item, hints[key]) if key in hints else item for key, item in value.items()}
    return value


# --- explaining a msgspec error -------------------------------------------------------------

_AT = re.compile(r"^(?P<message>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_PART = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_WHAT = {
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "bool": "true or false",
    "object": "an object",
    "array": "an array",
    "null": "null",
}
#: msgspec's name of a JSON value's kind -> what the 400 says it got.
_GOT = {
    "int": "a number",
    "float": "a number",
    "str": "a string",
    "bool": "a boolean",
    "null": "null",
    "array": "an array",
    "object": "an object",
}


def _kind(value: Any) -> str:
    """What the 400 says a plain JSON value is."""
    names = {type(None): "null", bool: "bool", int: "int", float: "float", str: "str", list: "array", dict: "object"}
    return _GOT.get(names.get(type(value), ""), type(value).__name__)


def _parts(path: str) -> list[str | int]:
    return [name or (int(index) if index.isdigit() else index) for name, index in _PART.findall(path)]


def _type_at(parts: list[str | int], cls: type) -> Any:
    """The (annotated) type the record ``cls`` declares at ``parts``."""
    tp: Any = cls
    for part in parts:
        arms = _arms(_strip(tp))
        if isinstance(part, int):
            tp = next((typing.get_args(a)[0] for a in arms if typing.get_origin(a) is list), Any)
            continue
        record = next((a for a in arms if _is_record(a)), None)
        mapping = next((a for a in arms if typing.get_origin(a) is dict), None)
        if record is not None:
            tp = _hints(record).get(part, Any)
        else:
            tp = typing.get_args(mapping)[1] if mapping is not None else Any
    return tp


def _described(tp: Any, expected: str) -> str:
    """What ``tp`` accepts, in words: its ``Meta`` description, else msgspec's ``expected``."""
    if typing.get_origin(tp) is Annotated:
        for meta in typing.get_args(tp)[1:]:
            if isinstance(meta, msgspec.Meta) and meta.description:
                return meta.description
    names = [name for name in expected.split(" | ") if name != "null"] or ["null"]
    words = [_WHAT.get(name, name) for name in names]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _explain(error: str, cls: type) -> tuple[str, str]:
    """``(path, message)`` of msgspec's ``error`` about a body decoded as ``cls``."""
    match = _AT.match(error)
    assert match is not None  # the pattern matches any text
    message, parts = match["message"], _parts(match["path"] or "")
    path = ""
    for part in parts:
        path = join_path(path, part) if part != "..." else f"{path}[...]"
    if found := re.fullmatch(r"Object contains unknown field `(.*)`", message):
        return join_path(path, found[1]), "unknown field"
    if found := re.fullmatch(r"Object missing required field `(.*)`", message):
        return join_path(path, found[1]), "field required"
    if found := re.fullmatch(r"Expected `(.*)`, got `(.*)`", message):
        return path, f"must be {_described(_type_at(parts, cls), found[1])}, got {_GOT.get(found[2], found[2])}"
    return path, message
