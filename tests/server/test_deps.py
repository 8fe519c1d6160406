"""``deps``: handlers are given the decoded body, the model name, the engine and the tokenizer by
Litestar's dependency injection, in the order of the checks: body (400), model (404), ready (503)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from litestar import Litestar, post
from litestar.datastructures import State
from litestar.di import NamedDependency
from litestar.testing import TestClient

from metrale_core.server import decode
from metrale_core.server.deps import DEPENDENCIES, body_post, with_body
from metrale_core.server.errors import APIError, exception_handlers
from metrale_core.server.schemas import DetokenizeRequest


class FakeHost:
    """A host serving model ``m``: ``ready()`` counts its calls and is a 503 until loaded."""

    def __init__(self) -> None:
        self.config = SimpleNamespace(served_model_name="m")
        self.served: Any = None
        self.ready_calls = 0

    def ready(self) -> Any:
        self.ready_calls += 1
        if self.served is None:
            raise APIError(503, "the model is still loading")
        return self.served


@post("/probe", dependencies=with_body(DetokenizeRequest))
async def probe(
    req: NamedDependency[DetokenizeRequest],
    model_name: NamedDependency[str],
    engine: NamedDependency[Any],
    tokenizer: NamedDependency[Any],
) -> dict[str, Any]:
    return {"tokens": req.tokens, "model": model_name, "engine": engine.name, "tokenizer": tokenizer.name}


@body_post("/probe-body", DetokenizeRequest, tag="probe", ok="Detokenized", operation_id="probeBody")
async def probe_body(req: NamedDependency[DetokenizeRequest], model_name: NamedDependency[str]) -> dict[str, Any]:
    return {"tokens": req.tokens, "model": model_name}


@pytest.fixture
def client_and_host():
    host = FakeHost()
    app = Litestar(
        route_handlers=[probe, probe_body],
        dependencies=DEPENDENCIES,
        exception_handlers=exception_handlers(),
        state=State({"host": host}),
    )
    with TestClient(app) as client:
        yield client, host


def test_answers_come_in_the_order_of_the_checks(client_and_host):
    client, host = client_and_host
    bad = client.post("/probe", json={"tokens": "x"})
    assert bad.status_code == 400 and "tokens: must be an array" in bad.json()["error"]["message"]
    unknown = client.post("/probe", json={"tokens": [1], "model": "other"})
    assert unknown.status_code == 404
    assert host.ready_calls == 0  # neither reached the served model
    loading = client.post("/probe", json={"tokens": [1]})
    assert loading.status_code == 503 and host.ready_calls == 1


def test_engine_and_tokenizer_come_from_one_served_model(client_and_host, monkeypatch):
    client, host = client_and_host
    decodes = []
    strict = decode._decoder
    monkeypatch.setattr(decode, "_decoder", lambda cls: decodes.append(cls) or strict(cls))
    host.served = SimpleNamespace(engine=SimpleNamespace(name="E"), tokenizer=SimpleNamespace(name="T"))
    resp = client.post("/probe", json={"tokens": [1, 2]})
    assert resp.status_code == 201, resp.text
    assert resp.json() == {"tokens": [1, 2], "model": "m", "engine": "E", "tokenizer": "T"}
    assert host.ready_calls == 1  # one served model per request, shared by engine and tokenizer
    assert decodes == [DetokenizeRequest]  # the body was decoded once


def test_body_post_declares_a_documented_200_route_with_the_body(client_and_host):
    client, _ = client_and_host
    resp = client.post("/probe-body", json={"tokens": [3]})
    assert resp.status_code == 200 and resp.json() == {"tokens": [3], "model": "m"}
    bad = client.post("/probe-body", json={"tokens": "x"})
    assert bad.status_code == 400 and "tokens: must be an array" in bad.json()["error"]["message"]
    operation = client.app.openapi_schema.paths["/probe-body"].post
    assert operation.tags == ["probe"] and operation.operation_id == "probeBody"
    assert operation.request_body is not None and operation.request_body.required
    assert {"200", "400", "404", "503"} <= set(operation.responses)
