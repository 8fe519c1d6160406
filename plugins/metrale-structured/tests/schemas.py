"""The JSON Schemas the end-to-end tests and the benchmark send (25+, each bounded so a reply
finishes within a modest ``max_tokens``: strings carry ``maxLength`` / ``enum`` / ``pattern``,
arrays ``maxItems``, numbers bounds).  Every reply must ``json.loads`` and validate against its
schema with the ``jsonschema`` library."""

from __future__ import annotations

S = {"type": "string", "maxLength": 12}
NAME = {"type": "string", "minLength": 1, "maxLength": 10}

SCHEMAS: dict[str, dict] = {
    "flat": {
        "type": "object",
        "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "optional": {
        "type": "object",
        "properties": {"title": S, "note": S},
        "required": ["title"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 999}, "nick": NAME},
                "required": ["id", "nick"],
                "additionalProperties": False,
            }
        },
        "required": ["user"],
        "additionalProperties": False,
    },
    "deep": {
        "type": "object",
        "properties": {
            "a": {
                "type": "object",
                "properties": {
                    "b": {
                        "type": "object",
                        "properties": {"c": {"type": "boolean"}},
                        "required": ["c"],
                        "additionalProperties": False,
                    }
                },
                "required": ["b"],
                "additionalProperties": False,
            }
        },
        "required": ["a"],
        "additionalProperties": False,
    },
    "array-bounds": {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": NAME, "minItems": 1, "maxItems": 3}},
        "required": ["tags"],
        "additionalProperties": False,
    },
    "array-ints": {
        "type": "array",
        "items": {"type": "integer", "minimum": -50, "maximum": 50},
        "minItems": 2,
        "maxItems": 4,
    },
    "array-objects": {
        "type": "array",
        "maxItems": 2,
        "minItems": 1,
        "items": {
            "type": "object",
            "properties": {"k": NAME, "v": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["k", "v"],
            "additionalProperties": False,
        },
    },
    "enum": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}},
        "required": ["color"],
        "additionalProperties": False,
    },
    "enum-mixed": {"enum": ["yes", "no", 1, None, True]},
    "const": {
        "type": "object",
        "properties": {"kind": {"const": "point"}, "x": {"type": "integer", "minimum": 0, "maximum": 10}},
        "required": ["kind", "x"],
        "additionalProperties": False,
    },
    "anyof": {
        "type": "object",
        "properties": {
            "value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 100}, {"type": "string", "maxLength": 8}]}
        },
        "required": ["value"],
        "additionalProperties": False,
    },
    "anyof-objects": {
        "anyOf": [
            {"type": "object", "properties": {"cat": NAME}, "required": ["cat"], "additionalProperties": False},
            {"type": "object", "properties": {"dog": NAME}, "required": ["dog"], "additionalProperties": False},
        ]
    },
    "ref-defs": {
        "$defs": {
            "pt": {
                "type": "object",
                "properties": {
                    "x": {"type": "integer", "minimum": 0, "maximum": 9},
                    "y": {"type": "integer", "minimum": 0, "maximum": 9},
                },
                "required": ["x", "y"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {"start": {"$ref": "#/$defs/pt"}, "end": {"$ref": "#/$defs/pt"}},
        "required": ["start", "end"],
        "additionalProperties": False,
    },
    "ref-array": {
        "$defs": {"item": {"type": "string", "enum": ["a", "b", "c"]}},
        "type": "array",
        "items": {"$ref": "#/$defs/item"},
        "minItems": 1,
        "maxItems": 3,
    },
    "pattern": {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}},
        "required": ["code"],
        "additionalProperties": False,
    },
    "pattern-phone": {"type": "string", "pattern": "^\\+[0-9]{2} [0-9]{4}$"},
    "format-date": {
        "type": "object",
        "properties": {"day": {"type": "string", "format": "date"}},
        "required": ["day"],
        "additionalProperties": False,
    },
    "format-time": {"type": "string", "format": "time"},
    "format-uuid": {"type": "string", "format": "uuid"},
    "number-bounds": {
        "type": "object",
        "properties": {
            "t": {"type": "integer", "minimum": -20, "maximum": 45},
            "p": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 100},
        },
        "required": ["t", "p"],
        "additionalProperties": False,
    },
    "bool-null": {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "none": {"type": "null"}},
        "required": ["ok", "none"],
        "additionalProperties": False,
    },
    "integer-only": {"type": "integer", "minimum": 100, "maximum": 999},
    "string-only": {"type": "string", "minLength": 2, "maxLength": 6},
    "type-union": {"type": ["integer", "boolean"], "minimum": 0, "maximum": 9},
    "nested-arrays": {
        "type": "array",
        "maxItems": 2,
        "minItems": 1,
        "items": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2},
    },
    "required-many": {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "minimum": 0, "maximum": 9},
            "b": {"type": "boolean"},
            "c": {"enum": ["x", "y"]},
            "d": {"type": "null"},
        },
        "required": ["a", "b", "c", "d"],
        "additionalProperties": False,
    },
    "oneof-enum": {"oneOf": [{"const": "left"}, {"const": "right"}]},
}

assert len(SCHEMAS) >= 25
