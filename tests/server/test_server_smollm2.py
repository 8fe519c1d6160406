"""The real embedded model (SmolLM2-135M-Instruct Q4_1) behind the server: the chat round trip
"What is the capital of France?" -> "The capital of France is Paris." through the openai client."""

from __future__ import annotations

import pytest

from metrale_core.testing.requires import missing
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2_server(start_server):
    from metrale_core.embedded import cache_dir
    from metrale_core.engine import EngineConfig, LLMEngine
    from metrale_core.loading import load_model
    from metrale_core.server import ServedModel

    path = cache_dir() / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        missing(f"{path} is not cached (run met generate once to fetch it)")

    def load():
        loaded = load_model(path, progress=False)
        engine = LLMEngine(loaded.model, EngineConfig(kv_cache_memory=64 << 20),
                           tokenizer=loaded.tokenizer)
        return ServedModel(engine=engine, tokenizer=loaded.tokenizer, model_type="llama")

    return start_server(loader=load, served_model_name="SmolLM2-135M-Instruct")


def test_capital_of_france_round_trip(smollm2_server):
    import openai

    server, _ = smollm2_server
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    resp = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", temperature=0, max_tokens=32,
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert resp.choices[0].message.content == "The capital of France is Paris."
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage.prompt_tokens == 37 and resp.usage.completion_tokens == 8
    stream = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", temperature=0, max_tokens=32, stream=True,
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == \
        "The capital of France is Paris."
