"""``/v1/responses`` fields this server cannot honour are refused, not silently ignored: every
``include`` value and ``truncation`` other than ``disabled`` is a 400 (through the official
``openai`` client on a real uvicorn server with the scripted model) naming the field and value."""

from __future__ import annotations

import openai
import pytest


@pytest.mark.parametrize(
    "change,param,value",
    [
        ({"include": ["reasoning.encrypted_content"]}, "include[0]", "reasoning.encrypted_content"),
        ({"include": ["message.output_text.logprobs"]}, "include[0]", "message.output_text.logprobs"),
        ({"truncation": "auto"}, "truncation", "auto"),
    ],
)
def test_unsupported_include_and_truncation_are_a_400(client, change, param, value):
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="scripted", input="What is the capital of France?", **change)
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == param, error
    assert value in error["message"], error


def test_truncation_disabled_and_empty_include_are_accepted(client):
    r = client.responses.create(
        model="scripted", input="What is the capital of France?", truncation="disabled", include=[]
    )
    assert r.status == "completed" and r.truncation == "disabled"
    assert "Paris" in r.output_text
