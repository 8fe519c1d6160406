"""Schema fuzz (schemathesis) against the server's own generated OpenAPI document.

Every documented operation (chat, completions, responses, messages, embeddings, tokenize, ...)
gets bounded, generated requests (valid and invalid bodies) through real uvicorn; the checks: no
5xx (``not_a_server_error``), every status documented for that operation
(``status_code_conformance``), the documented content types (``content_type_conformance``) and
every response body valid against the documented schema of its status
(``response_schema_conformance``).  Mismatches are collected over all operations and reported
together.  The server has a small context so generated ``max_tokens`` / ``n`` stay cheap.
"""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

MAX_EXAMPLES = 10


@pytest.fixture(scope="module")
def fuzz_server(start_server):
    return start_server(engine_options={"max_model_len": 96, "max_num_seqs": 8})


@pytest.fixture(scope="module")
def fuzz_url(fuzz_server):
    return fuzz_server[0].url


@pytest.fixture(scope="module")
def api_schema(fuzz_url):
    document = httpx.get(fuzz_url + "/schema/openapi.json", timeout=30).json()
    return schemathesis.openapi.from_dict(document)


def _operations(schema) -> list:
    return [result.ok() for result in schema.get_all_operations()]


def test_generated_requests_get_documented_answers(api_schema, fuzz_url):
    from hypothesis import given

    operations = _operations(api_schema)
    assert {op.path for op in operations} >= {
        "/v1/chat/completions",
        "/v1/completions",
        "/tokenize",
        "/detokenize",
        "/v1/models",
    }
    seen: dict[int, int] = {}
    checked: dict[str, set[int]] = {}
    mismatches: list[str] = []
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        def run(case):
            response = case.call(base_url=fuzz_url, timeout=60)
            seen[response.status_code] = seen.get(response.status_code, 0) + 1
            try:
                case.validate_response(
                    response,
                    checks=[
                        not_a_server_error,
                        status_code_conformance,
                        content_type_conformance,
                        response_schema_conformance,
                    ],
                )
            except (Exception, FailureGroup) as exc:  # collect all, report together
                first = str(exc).strip().splitlines()
                mismatches.append(f"{case.method} {case.path} -> {response.status_code}: {' | '.join(first[:6])}")
            checked.setdefault(f"{case.method} {case.path}", set()).add(response.status_code)

        run()
    assert not mismatches, "\n".join(mismatches)
    # the fuzz reached the handlers: accepted requests and refused ones, and nothing else
    assert seen.get(200, 0) > 0 and seen.get(400, 0) > 0, seen
    assert all(status < 500 for status in seen), seen
    # bodies were checked on every generating API
    for route in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/v1/embeddings"):
        assert checked.get(f"POST {route}"), (route, checked)
