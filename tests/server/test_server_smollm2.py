"""The real embedded model (SmolLM2-135M-Instruct Q4_1) behind the server: the chat round trip
"What is the capital of France?" -> "The capital of France is Paris." through the openai client."""

from __future__ import annotations

import pytest

from metrale_core.testing.requires import missing

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2_server(start_server):
    from metrale_core.engine import EngineConfig, LLMEngine
    from metrale_core.loading.embedded import cache_dir
    from metrale_core.loading.load import load_model
    from metrale_core.server import ServedModel

    path = cache_dir() / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        missing(f"{path} is not cached (run met generate once to fetch it)")

    def load():
        loaded = load_model(path, progress=False)
        engine = LLMEngine(loaded.model, EngineConfig(kv_cache_memory=64 << 20), tokenizer=loaded.tokenizer)
        return ServedModel(engine=engine, tokenizer=loaded.tokenizer, model_type="llama")

    return start_server(loader=load, served_model_name="SmolLM2-135M-Instruct")


def test_capital_of_france_round_trip(smollm2_server):
    import openai

    server, _ = smollm2_server
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    resp = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        temperature=0,
        max_tokens=32,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
    )
    assert resp.choices[0].message.content == "The capital of France is Paris."
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage.prompt_tokens == 37 and resp.usage.completion_tokens == 8
    stream = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        temperature=0,
        max_tokens=32,
        stream=True,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "The capital of France is Paris."


def test_responses_messages_and_embeddings_on_the_embedded_model(smollm2_server):
    """The three agent-facing APIs with the official clients on the real embedded model: the
    same greedy answer as chat, and unit-norm embeddings that agree batched and single."""
    import anthropic
    import numpy as np
    import openai

    server, _ = smollm2_server
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    question = "What is the capital of France?"
    r = client.responses.create(model="SmolLM2-135M-Instruct", input=question, temperature=0, max_output_tokens=32)
    assert r.output_text == "The capital of France is Paris." and r.status == "completed"
    assert r.usage.input_tokens == 37 and r.usage.output_tokens == 8
    with client.responses.stream(
        model="SmolLM2-135M-Instruct", input=question, temperature=0, max_output_tokens=32
    ) as s:
        assert s.get_final_response().output_text == "The capital of France is Paris."
    a = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=120)
    msg = a.messages.create(
        model="SmolLM2-135M-Instruct",
        max_tokens=32,
        messages=[{"role": "user", "content": question}],
        extra_body={"temperature": 0},
    )
    assert msg.content[0].text == "The capital of France is Paris."
    assert msg.stop_reason == "end_turn" and msg.usage.input_tokens == 37
    with a.messages.stream(
        model="SmolLM2-135M-Instruct",
        max_tokens=32,
        messages=[{"role": "user", "content": question}],
        stop_sequences=[" Paris"],
        extra_body={"temperature": 0},
    ) as s:
        final = s.get_final_message()
    assert final.content[0].text == "The capital of France is"
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == " Paris"
    assert (
        a.messages.count_tokens(
            model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": question}]
        ).input_tokens
        == 37
    )
    texts = ["Paris is the capital of France.", "Bananas are yellow."]
    batched = client.embeddings.create(model="SmolLM2-135M-Instruct", input=texts)
    for i, text in enumerate(texts):
        single = client.embeddings.create(model="SmolLM2-135M-Instruct", input=text)
        v, w = np.asarray(batched.data[i].embedding), np.asarray(single.data[0].embedding)
        assert abs(np.linalg.norm(v) - 1) < 1e-5 and np.abs(v - w).max() <= 1e-5
