"""``/v1/responses`` left-outs of issue 19, through the official ``openai`` client on a real uvicorn
server with the scripted model:

- fields this server cannot honour are refused, not silently ignored: every ``include`` value and
  ``truncation`` other than ``disabled`` is a 400 naming the field and value;
- ``usage.output_tokens_details.reasoning_tokens`` counts the reasoning item's tokens;
- an engine failure mid-stream ends the stream with ``response.failed`` (status ``failed``, the
  error's code and message) after the items so far are closed, not with a bare ``error`` event.
"""

from __future__ import annotations

import openai
import pytest
from server_testlib import ScriptedLM, scripted_served


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


def test_reasoning_tokens_are_the_reasoning_items_tokens(client, byte_tokenizer):
    r = client.responses.create(model="scripted", input="Please ponder 2+2.", reasoning={"effort": "low"})
    reasoning = "".join(part.text for item in r.output if item.type == "reasoning" for part in item.content or [])
    assert reasoning.strip() == "Two and two make four."
    expected = len(byte_tokenizer.encode(reasoning, add_special_tokens=False))
    assert r.usage.output_tokens_details.reasoning_tokens == expected
    assert 0 < expected < r.usage.output_tokens
    plain = client.responses.create(model="scripted", input="What is the capital of France?")
    assert plain.usage.output_tokens_details.reasoning_tokens == 0


class _FailingLM(ScriptedLM):
    """The scripted model whose forward raises once a reply to a prompt with "boom" is 15 tokens in."""

    def _logits(self, history):
        text = self.tokenizer.decode(history, skip_special_tokens=False)
        head, _, reply = text.rpartition("<|im_start|>assistant\n")
        if head and "boom" in head and len(self.tokenizer.encode(reply, add_special_tokens=False)) >= 15:
            raise RuntimeError("the accelerator caught fire")
        return super()._logits(history)


@pytest.fixture(scope="module")
def failing(start_server, byte_tokenizer):
    server, _host = start_server(loader=lambda: scripted_served(byte_tokenizer, model_class=_FailingLM))
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_engine_failure_mid_stream_is_response_failed(failing):
    events = list(failing.responses.create(model="scripted", input="Please ponder 2+2, boom.", stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.failed", types
    assert "error" not in types
    assert "response.reasoning_text.delta" in types
    added = [e.output_index for e in events if e.type == "response.output_item.added"]
    done = [e.output_index for e in events if e.type == "response.output_item.done"]
    assert added == done and added, (added, done)  # every open item is closed before the end
    failed = events[-1].response
    assert failed.status == "failed" and failed.error is not None
    assert failed.error.code == "server_error" and "the accelerator caught fire" in failed.error.message
    assert [e.sequence_number for e in events] == list(range(len(events)))
    # the server is still up: the next request answers
    ok = failing.responses.create(model="scripted", input="What is the capital of France?")
    assert ok.status == "completed" and "Paris" in ok.output_text
