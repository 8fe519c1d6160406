"""The Responses, Messages and embeddings routes are in the OpenAPI schema (with request bodies
generated from their records) and in ``/metrics`` by route."""

from __future__ import annotations

import httpx


def test_openapi_lists_the_three_apis(base_url):
    schema = httpx.get(base_url + "/schema/openapi.json").json()
    paths = schema["paths"]
    for path, method, field in [
        ("/v1/responses", "post", "input"),
        ("/v1/messages", "post", "max_tokens"),
        ("/v1/messages/count_tokens", "post", "messages"),
        ("/v1/embeddings", "post", "encoding_format"),
    ]:
        op = paths[path][method]
        body = op["requestBody"]["content"]["application/json"]["schema"]
        assert field in body["properties"], (path, sorted(body["properties"]))
    assert {"get", "delete"} <= set(paths["/v1/responses/{response_id}"])
    assert (
        "max_tokens"
        in paths["/v1/messages"]["post"]["requestBody"]["content"]["application/json"]["schema"]["required"]
    )


def test_metrics_count_requests_by_route(base_url, client):
    client.responses.create(model="scripted", input="capital")
    httpx.post(
        base_url + "/v1/messages",
        json={"model": "scripted", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
    )
    httpx.post(base_url + "/v1/messages", json={"model": "scripted"})  # a 400
    httpx.post(base_url + "/v1/embeddings", json={"model": "scripted", "input": "hi"})
    text = httpx.get(base_url + "/metrics").text
    lines = [line for line in text.splitlines() if line.startswith("metrale:http_requests_total")]

    def count(route: str, status: str) -> float:
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in lines
            if f'route="{route}"' in line and f'status="{status}"' in line
        )

    assert count("/v1/responses", "200") >= 1
    assert count("/v1/messages", "200") >= 1 and count("/v1/messages", "400") >= 1
    assert count("/v1/embeddings", "400") >= 1  # the scripted model has no hidden states
    assert (
        'metrale:http_request_duration_seconds_count{method="POST",model_name="scripted",route="/v1/responses"}' in text
    )
