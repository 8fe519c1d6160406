"""``errors.shaped_handlers``: another API's error shape gets the statuses and messages of the
OpenAI-shaped handlers, each failure answered as ``body(status, message)`` with its headers."""

from __future__ import annotations

import pytest
from litestar import Litestar, get
from litestar.testing import TestClient

from metrale_core.errors import RequestError
from metrale_core.server.errors import APIError, shaped_handlers


@get("/api-error")
async def api_error() -> None:
    raise APIError(503, "loading", headers={"Retry-After": "1"})


@get("/request-error")
async def request_error() -> None:
    raise RequestError("messages[0].role: unknown role")


@get("/fault")
async def fault() -> None:
    raise RuntimeError("boom")


@pytest.fixture(scope="module")
def client():
    app = Litestar(
        route_handlers=[api_error, request_error, fault],
        exception_handlers=shaped_handlers(lambda status, message: {"shape": "mine", "status": status, "msg": message}),
    )
    with TestClient(app) as client:
        yield client


@pytest.mark.parametrize(
    ("method", "path", "status", "message"),
    [
        ("GET", "/api-error", 503, "loading"),
        ("GET", "/request-error", 400, "messages[0].role: unknown role"),
        ("GET", "/fault", 500, "internal server error (RuntimeError)"),
        ("POST", "/fault", 405, "method POST is not allowed on /fault"),
        ("GET", "/nowhere", 404, "Not Found"),
    ],
)
def test_every_failure_answers_the_given_shape(client, method, path, status, message):
    resp = client.request(method, path)
    assert resp.status_code == status
    assert resp.json() == {"shape": "mine", "status": status, "msg": message}
    assert resp.headers["content-type"].startswith("application/json")


def test_an_api_errors_headers_are_kept(client):
    assert client.get("/api-error").headers["retry-after"] == "1"
