"""``openapi.json_schema``: msgspec's schema of the request records, inlined, as Litestar's
``Schema``, with the bounds of ``ranges.BOUNDS`` and the enums of the records' ``Meta``."""

from __future__ import annotations

import json

import pytest

from metrale_core.server.messages.records import MessagesRequest
from metrale_core.server.ollama.records import OllamaChatRequest
from metrale_core.server.openapi import json_schema
from metrale_core.server.ranges import BOUNDS
from metrale_core.server.responses.records import ResponsesRequest
from metrale_core.server.schemas import ROLES, ChatCompletionRequest, CompletionRequest, EmbeddingRequest


def doc(cls) -> dict:
    return json_schema(cls).to_schema()


def _number(prop: dict) -> dict | None:
    """The integer/number arm of a (possibly nullable) property (None: not a number)."""
    return next((arm for arm in prop.get("anyOf", [prop]) if arm.get("type") in ("integer", "number")), None)


@pytest.mark.parametrize(
    "cls", [ChatCompletionRequest, CompletionRequest, MessagesRequest, ResponsesRequest, OllamaChatRequest]
)
def test_every_bounded_field_documents_its_bound(cls):
    props = doc(cls)["properties"]
    seen = {name: arm for name in props if name in BOUNDS and (arm := _number(props[name])) is not None}
    assert seen
    for name, arm in seen.items():
        bound = BOUNDS[name]
        if bound.low is not None:
            assert arm["exclusiveMinimum" if bound.low_open else "minimum"] == bound.low, name
        if bound.high is not None:
            assert arm["exclusiveMaximum" if bound.high_open else "maximum"] == bound.high, name


def test_the_document_refuses_what_the_decoder_refuses():
    chat = doc(ChatCompletionRequest)
    assert chat["additionalProperties"] is False and chat["required"] == ["messages"]
    message = chat["properties"]["messages"]["items"]
    assert message["additionalProperties"] is False
    assert message["properties"]["role"]["enum"] == list(ROLES)
    assert "$ref" not in json.dumps(chat) and "$defs" not in json.dumps(chat)
    content = message["properties"]["content"]
    assert content["description"] == "a string or an array of content parts"
    assert [arm.get("type") for arm in content["anyOf"]] == ["string", "array", "null"]


def test_prompt_and_free_form_fields():
    prompt = doc(EmbeddingRequest)["properties"]["input"]
    assert [arm["type"] for arm in prompt["anyOf"]] == ["string", "array"]
    responses = doc(ResponsesRequest)
    assert responses["required"] == ["input"] and responses["properties"]["input"] == {}
