"""The official ``openai`` client against a real uvicorn server on loopback (scripted model)."""

from __future__ import annotations

import json

import pytest


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_chat_round_trip_with_exact_usage(client, byte_tokenizer):
    resp = client.chat.completions.create(model="scripted", messages=user("capital of France?"), temperature=0)
    choice = resp.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == "The capital of France is Paris."
    assert choice.finish_reason == "stop"
    prompt = byte_tokenizer.encode_chat(user("capital of France?"))
    # one token per byte, plus the final <|im_end|>
    assert resp.usage.prompt_tokens == len(prompt)
    assert resp.usage.completion_tokens == len("The capital of France is Paris.") + 1
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    assert resp.object == "chat.completion" and resp.model == "scripted"


def test_chat_content_parts_and_system_message(client):
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "the capital"}, {"type": "text", "text": " of France"}]},
    ]
    resp = client.chat.completions.create(model="scripted", messages=messages, temperature=0)
    assert resp.choices[0].message.content == "The capital of France is Paris."


def test_chat_streaming_role_first_done_last_and_include_usage(client, base_url):
    stream = client.chat.completions.create(
        model="scripted",
        messages=user("count please"),
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "one two three four five six seven eight nine ten"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(text) + 1

    import httpx

    raw = httpx.post(
        base_url + "/v1/chat/completions", json={"messages": user("count"), "stream": True, "max_tokens": 3}
    ).text
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"


def test_stop_strings_are_cut_and_never_leak_while_streaming(client):
    resp = client.chat.completions.create(
        model="scripted", messages=user("count"), temperature=0, stop=["four", "nine"]
    )
    assert resp.choices[0].message.content == "one two three "
    assert resp.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(
        model="scripted", messages=user("count"), temperature=0, stop=["four"], stream=True
    )
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(pieces) == "one two three "
    assert not any("fo" in p for p in pieces)


def test_stop_token_ids_and_max_tokens_length(client, byte_tokenizer):
    space = byte_tokenizer.encode(" ", add_special_tokens=False)[0]
    resp = client.chat.completions.create(
        model="scripted", messages=user("count"), temperature=0, extra_body={"stop_token_ids": [space]}
    )
    assert resp.choices[0].message.content == "one"
    resp = client.chat.completions.create(
        model="scripted", messages=user("count"), temperature=0, max_completion_tokens=5
    )
    assert resp.choices[0].message.content == "one t"
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 5


def test_utf8_multibyte_text_streams_without_broken_characters(client):
    stream = client.chat.completions.create(model="scripted", messages=user("un café"), temperature=0, stream=True)
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(pieces) == "Un café crème, s'il vous plaît ☕ merci"
    assert not any("\ufffd" in p for p in pieces)


def test_n2_choices_with_seeds_and_usage(client):
    kwargs = dict(model="scripted", prompt="hello there", max_tokens=8, temperature=1.0, seed=7)
    resp = client.completions.create(n=2, **kwargs)
    assert sorted(c.index for c in resp.choices) == [0, 1]
    texts = [c.text for c in sorted(resp.choices, key=lambda c: c.index)]
    assert texts[0] != texts[1]  # choice i samples with seed + i
    assert resp.usage.completion_tokens == 16 and resp.usage.prompt_tokens == len("hello there")
    again = client.completions.create(n=2, **kwargs)
    assert [c.text for c in sorted(again.choices, key=lambda c: c.index)] == texts
    single = client.completions.create(n=1, **{**kwargs, "seed": 8})
    assert single.choices[0].text == texts[1]


def test_seed_determinism_and_seed_sensitivity(client):
    def sample(seed):
        return (
            client.completions.create(model="scripted", prompt="abc", max_tokens=12, temperature=1.0, seed=seed)
            .choices[0]
            .text
        )

    assert sample(1) == sample(1)
    assert len({sample(s) for s in (1, 2, 3)}) > 1


def test_n2_streaming_chat(client):
    stream = client.chat.completions.create(
        model="scripted", messages=user("count"), n=2, temperature=0, stream=True, max_tokens=7
    )
    texts = {0: "", 1: ""}
    finished = {}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished[c.index] = c.finish_reason
    assert texts == {0: "one two", 1: "one two"}
    assert finished == {0: "length", 1: "length"}


def test_chat_logprobs_shape(client):
    resp = client.chat.completions.create(
        model="scripted", messages=user("capital"), temperature=0, logprobs=True, top_logprobs=2, max_tokens=4
    )
    content = resp.choices[0].logprobs.content
    assert [e.token for e in content] == ["T", "h", "e", " "]
    for entry in content:
        assert entry.bytes == list(entry.token.encode())
        assert entry.logprob == pytest.approx(0.0, abs=1e-3)  # the scripted logit dominates
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].token == entry.token


def test_completion_logprobs_shape_and_stream(client):
    resp = client.completions.create(model="scripted", prompt="xyz", max_tokens=5, logprobs=3, temperature=0)
    lp = resp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert lp.text_offset == [0, 1, 2, 3, 4]
    assert all(len(top) >= 1 for top in lp.top_logprobs)
    assert "".join(lp.tokens) == resp.choices[0].text or "\ufffd" in resp.choices[0].text
    stream = client.completions.create(
        model="scripted", prompt="xyz", max_tokens=5, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == resp.choices[0].text
    assert chunks[-1].usage.completion_tokens == 5 and chunks[-1].usage.prompt_tokens == 3


def test_completion_token_id_prompts_and_echo(client, byte_tokenizer):
    ids = byte_tokenizer.encode("hi", add_special_tokens=False)
    by_ids = client.completions.create(model="scripted", prompt=ids, max_tokens=4, temperature=0)
    by_text = client.completions.create(model="scripted", prompt="hi", max_tokens=4, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    echoed = client.completions.create(model="scripted", prompt="hi", max_tokens=4, temperature=0, echo=True)
    assert echoed.choices[0].text == "hi" + by_text.choices[0].text
    batch = client.completions.create(model="scripted", prompt=["hi", "yo"], max_tokens=2, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1]
    assert batch.choices[0].text == by_text.choices[0].text[: len(batch.choices[0].text)]


def test_models_route(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["scripted"]
    assert client.models.retrieve("scripted").id == "scripted"


def test_tokenize_and_detokenize(base_url, byte_tokenizer):
    import httpx

    out = httpx.post(base_url + "/tokenize", json={"prompt": "héllo"}).json()
    assert out["tokens"] == byte_tokenizer.encode("héllo") and out["count"] == 6
    assert httpx.post(base_url + "/detokenize", json={"tokens": out["tokens"]}).json() == {"prompt": "héllo"}
    chat = httpx.post(
        base_url + "/tokenize", json={"messages": user("hi"), "chat_template_kwargs": {"enable_thinking": False}}
    ).json()
    text = byte_tokenizer.decode(chat["tokens"], skip_special_tokens=False)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_response_format_json_object_is_refused_without_a_structured_plugin(start_server, client):
    import importlib.metadata

    import openai

    from metrale_core.plugin.discovery import load_registry

    eps = [ep for ep in importlib.metadata.entry_points(group="metrale") if ep.name != "structured"]
    bare, _ = start_server(registry=load_registry(entry_points=eps))
    bare_client = openai.OpenAI(base_url=bare.url + "/v1", api_key="x", max_retries=0, timeout=30)
    for extra in (
        {"response_format": {"type": "json_object"}},
        {"extra_body": {"structured_outputs": {"regex": "[0-9]+"}}},
    ):
        with pytest.raises(openai.BadRequestError) as info:
            bare_client.chat.completions.create(model="scripted", messages=user("capital"), **extra)
        assert "needs a structured-output plugin" in info.value.body["message"]
    resp = client.chat.completions.create(
        model="scripted", messages=user("capital"), temperature=0, response_format={"type": "text"}
    )
    assert resp.choices[0].message.content.endswith("Paris.")


def test_openapi_schema_is_served(base_url):
    import httpx

    schema = httpx.get(base_url + "/schema/openapi.json").json()
    assert "/v1/chat/completions" in schema["paths"] and "/v1/completions" in schema["paths"]
    body = schema["paths"]["/v1/chat/completions"]["post"]["requestBody"]
    assert "messages" in json.dumps(body) or "ChatCompletionRequest" in json.dumps(body)
