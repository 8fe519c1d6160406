"""Reasoning budgets through the server (official clients, real uvicorn, the scripted model whose
"ponder" reply thinks "Two and two make four." before answering):

- chat's ``thinking_token_budget`` (vLLM's field) ends the reasoning after that many tokens by
  forcing ``</think>``; the answer follows as content;
- Messages' ``thinking.budget_tokens`` does the same, and must be less than ``max_tokens``;
- a budget on a server with no reasoning format is a 400 naming the field.

Nothing here depends on timing: the tests run on servers of their own, paced at both extremes
(every step its own delta, or all after the first merged into one), so load cannot change what they see.
"""

from __future__ import annotations

import anthropic
import openai
import pytest

PONDER = [{"role": "user", "content": "Please ponder 2+2."}]


@pytest.fixture(scope="module", params=[0.0, 5000.0], ids=["per-step", "coalesced"])
def budget_url(request, start_server):
    """A server of this module's own (no request of another test module shares its engine, so
    nothing but these tests' replies decides when theirs are scheduled) whose stream pacing is
    fixed at both ends of what load can produce: every step its own delta (0 ms), or every step
    after the first merged into the last delta (5 s: a reply takes far less)."""
    server, host = start_server(stream_interval_ms=request.param)
    assert host.async_engine.stream_interval_s == pytest.approx(request.param / 1000)
    return server.url


@pytest.fixture
def client(budget_url):
    return openai.OpenAI(base_url=budget_url + "/v1", api_key="x", max_retries=0, timeout=120)


def _chat(client, **extra):
    r = client.chat.completions.create(model="scripted", messages=PONDER, temperature=0, max_tokens=120, **extra)
    message = r.choices[0].message
    return getattr(message, "reasoning_content", None) or "", message.content or "", r.choices[0].finish_reason


def test_chat_budget_cuts_the_reasoning(client):
    free_reasoning, free_answer, _ = _chat(client)
    assert free_reasoning.strip() == "Two and two make four." and free_answer.strip() == "The answer is 4."
    reasoning, answer, finish = _chat(client, extra_body={"thinking_token_budget": 5})
    assert reasoning.strip() == "Two", reasoning  # "\nTwo " is 5 tokens of the byte tokenizer
    assert answer and "</think>" not in reasoning and finish == "stop"
    # a budget the model stays inside changes nothing
    assert _chat(client, extra_body={"thinking_token_budget": 100})[:2] == (free_reasoning, free_answer)


def test_chat_budget_streamed_matches_whole(client):
    """Streamed and whole agree however the steps are grouped into deltas: the budget cut is a
    function of the output ids (the logit processor), never of how or when they are delivered."""
    whole = _chat(client, extra_body={"thinking_token_budget": 5})
    assert whole[0].strip() == "Two" and whole[1], whole
    stream = client.chat.completions.create(
        model="scripted",
        messages=PONDER,
        temperature=0,
        max_tokens=120,
        stream=True,
        extra_body={"thinking_token_budget": 5},
    )
    reasoning, answer = "", ""
    for chunk in stream:
        for choice in chunk.choices:
            reasoning += getattr(choice.delta, "reasoning_content", None) or ""
            answer += choice.delta.content or ""
    assert (reasoning, answer) == whole[:2]


def test_bad_budgets_are_400(client):
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(client, extra_body={"thinking_token_budget": -1})
    assert "thinking_token_budget" in str(caught.value)


def test_messages_budget_tokens(budget_url):
    c = anthropic.Anthropic(base_url=budget_url, api_key="x", max_retries=0, timeout=120)
    m = c.messages.create(
        model="scripted", max_tokens=120, messages=PONDER, thinking={"type": "enabled", "budget_tokens": 5}
    )
    kinds = [b.type for b in m.content]
    assert kinds == ["thinking", "text"], kinds
    assert m.content[0].thinking.strip() == "Two" and m.content[1].text
    with pytest.raises(anthropic.BadRequestError) as caught:
        c.messages.create(
            model="scripted", max_tokens=50, messages=PONDER, thinking={"type": "enabled", "budget_tokens": 50}
        )
    assert "thinking.budget_tokens" in str(caught.value) and "max_tokens" in str(caught.value)


def test_budget_without_a_reasoning_format_is_400(start_server):
    server, _host = start_server(reasoning_parser="none")
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(c, extra_body={"thinking_token_budget": 5})
    body = caught.value.body
    assert isinstance(body, dict) and body["param"] == "thinking_token_budget", body
    assert "no reasoning format" in body["message"]
