"""Checks of live answers against the server's own OpenAPI document (schemathesis).

Owner: the schema fuzz (``test_server_fuzz.py``) and the route tests that check their 200 bodies
against the document (embeddings).  :class:`Checked` runs every check on a call and collects the
mismatches, so one run reports all of them.
"""

from __future__ import annotations

import httpx
import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)


def _served_model_only(document: dict, name: str) -> dict:
    """The document with every request's ``model`` (body field or path parameter) pinned to the
    served name, so generated requests reach the handlers (and their 200 bodies get checked)
    instead of stopping at the unknown model's 404."""
    for methods in document["paths"].values():
        for operation in methods.values():
            for parameter in operation.get("parameters", []):
                if parameter.get("name") == "model" and parameter.get("in") == "path":
                    parameter["schema"] = {"type": "string", "enum": [name]}
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            if "model" in body.get("properties", {}):
                body["properties"]["model"] = {"type": "string", "enum": [name]}
    return document


def documented_schema(url: str, model: str, bodies: dict[str, dict] | None = None):
    """The schemathesis schema of the server at ``url``'s document, ``model`` pinned; ``bodies``
    replaces the request-body schema of the ``POST`` operations at those paths (a narrower one, so
    a stateful run gets mostly valid requests and reaches the states behind them)."""
    document = httpx.get(url + "/schema/openapi.json", timeout=30).json()
    for path, schema in (bodies or {}).items():
        document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"] = schema
    return schemathesis.openapi.from_dict(_served_model_only(document, model))


CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


class Checked:
    """The statuses each operation answered and every mismatch with the document, reported together."""

    def __init__(self) -> None:
        self.seen: dict[int, int] = {}
        self.statuses: dict[str, set[int]] = {}
        self.mismatches: list[str] = []

    def call(self, case, base_url: str):
        response = case.call(base_url=base_url, timeout=60)
        self.seen[response.status_code] = self.seen.get(response.status_code, 0) + 1
        try:
            case.validate_response(response, checks=CHECKS)
        except (Exception, FailureGroup) as exc:  # collect all, report together
            first = str(exc).strip().splitlines()
            self.mismatches.append(f"{case.method} {case.path} -> {response.status_code}: {' | '.join(first[:6])}")
        self.statuses.setdefault(f"{case.method} {case.path}", set()).add(response.status_code)
        return response
