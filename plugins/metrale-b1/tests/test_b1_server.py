"""End to end over the real server: uvicorn on loopback, the official ``openai`` client, the
installed plugin registry (so the real ``b1-margin`` factory, the served engine's own ``B1Stats`` and
the ``metrale_metrics`` hook).  The scripted chat model (the server tests' ``ScriptedLM``) replies
with reasoning that contains a call-shaped text, then a hermes tool call; every position has a
top-1/top-2 gap of exactly 1.0.  Each request adds exactly 7 to
``metrale:b1_low_margin_positions_total``: 5 positions inside "Paris" and 2 inside 12."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "server"))
from b1_testlib import GapModel
from server_testlib import ScriptedLM, wait_ready, write_tokenizer

REPLY = (
    '<think>\nMaybe <tool_call>\n{"name": "x", "arguments": {"a": "zzzz"}}\n</tool_call>\n'
    '</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
    '"days": 12}}\n</tool_call>'
)
EXPECTED_PER_REQUEST = 7
METRIC = "metrale:b1_low_margin_positions_total"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather forecast of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
        },
    }
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


class ToolCallingLM(ScriptedLM):
    """Replies :data:`REPLY` to every chat prompt."""

    def _reply(self, prompt):
        return self.tokenizer.encode(REPLY, add_special_tokens=False)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from metrale_core.engine import EngineConfig, LLMEngine
    from metrale_core.plugin.discovery import load_registry
    from metrale_core.server import ServedModel, ServerConfig, create_app, serve_in_thread
    from metrale_core.text.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(write_tokenizer(tmp_path_factory.mktemp("b1tok")))
    runner_up = tokenizer.encode("~", add_special_tokens=False)[0]
    assert runner_up not in tokenizer.encode(REPLY, add_special_tokens=False)
    registry = load_registry()

    def load():
        model = GapModel(ToolCallingLM(tokenizer), gap=1.0, runner_up=runner_up)
        engine = LLMEngine(
            model,
            EngineConfig(block_size=16, num_kv_blocks=256, max_num_seqs=8),
            tokenizer=tokenizer,
            registry=registry,
        )
        return ServedModel(engine=engine, tokenizer=tokenizer, model_type="qwen3")

    app = create_app(ServerConfig(served_model_name="scripted"), load, registry)
    server = serve_in_thread(app)
    try:
        wait_ready(server.url)
        yield server.url, app.state.host
    finally:
        server.stop()


def scrape(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    (line,) = [ln for ln in text.splitlines() if ln.startswith(METRIC + " ")]
    return float(line.split()[1])


def test_metrics_show_the_exact_count(served):
    url, host = served
    assert "b1-margin" in host.served.engine.output_processor.pipeline.processor_names
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    before = scrape(url)

    resp = client.chat.completions.create(model="scripted", messages=ASK, tools=TOOLS, temperature=0)
    (call,) = resp.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 12}
    assert "zzzz" in resp.choices[0].message.reasoning_content
    assert scrape(url) == before + EXPECTED_PER_REQUEST

    stream = client.chat.completions.create(model="scripted", messages=ASK, tools=TOOLS, temperature=0, stream=True)
    args = "".join(
        tc.function.arguments or ""
        for chunk in stream
        for tc in (chunk.choices[0].delta.tool_calls or [])
        if tc.function
    )
    assert json.loads(args) == {"city": "Paris", "days": 12}
    assert scrape(url) == before + 2 * EXPECTED_PER_REQUEST

    # without tools the call is plain content: nothing is parsed as a body, nothing counted
    plain = client.chat.completions.create(model="scripted", messages=ASK, temperature=0)
    assert '"city": "Paris"' in plain.choices[0].message.content
    assert scrape(url) == before + 2 * EXPECTED_PER_REQUEST
