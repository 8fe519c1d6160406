"""The Responses, Messages and embeddings APIs with the real Qwen3 tokenizer and chat template.

Two servers: the scripted model behind the real Qwen3 template (so tool calls, tool results and
thinking go through Qwen3's own rendering, the hermes tool parser and the qwen3 reasoning
splitter with deterministic replies), and a random-weight Qwen3 checkpoint with the same
tokenizer (the real loader and forward).  The prompt each API renders is checked against
transformers' ``apply_chat_template`` of the equivalent conversation (its token count is the
``usage`` / ``count_tokens`` answer).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import anthropic
import numpy as np
import openai
import pytest
import torch
import transformers
from server_testlib import answer_function_call, answer_tool_use

import metrale_qwen3  # noqa: F401 -- a hard test dependency: missing is an error, not a skip

QWEN3 = Path(os.environ.get("METRALE_QWEN3_TOKENIZER_DIR") or Path.home() / ".cache/metrale/tokenizers/qwen3")
if not (QWEN3 / "tokenizer.json").is_file():
    pytest.skip(f"no Qwen3 tokenizer in {QWEN3} (scripts/fetch-test-data.sh)", allow_module_level=True)

TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ATOOL = {"name": "get_weather", "description": "Weather of a city", "input_schema": TOOL["parameters"]}
CHAT_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather of a city", "parameters": TOOL["parameters"]},
}


@pytest.fixture(scope="module")
def hf_tok():
    return transformers.AutoTokenizer.from_pretrained(str(QWEN3))


@pytest.fixture(scope="module")
def scripted(start_server):
    from server_testlib import ScriptedLM

    from metrale_core.engine import EngineConfig, LLMEngine
    from metrale_core.plugin.discovery import load_registry
    from metrale_core.server import ServedModel
    from metrale_core.text.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(QWEN3)
    registry = load_registry()

    def load():
        engine = LLMEngine(
            ScriptedLM(tok),
            EngineConfig(block_size=16, num_kv_blocks=256, max_num_seqs=8),
            tokenizer=tok,
            registry=registry,
        )
        return ServedModel(engine=engine, tokenizer=tok, model_type="qwen3")

    server, _ = start_server(loader=load, served_model_name="qwen3", registry=registry)
    return (
        server.url,
        openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120),
        anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=120),
    )


def _hf_len(hf_tok, messages, **kwargs) -> int:
    return len(
        hf_tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False, **kwargs)
    )


def test_responses_tool_round_trip_with_qwen3_template(scripted, hf_tok):
    _, client, _ = scripted
    first = client.responses.create(model="qwen3", input="What is the weather in Paris?", tools=[TOOL])
    call, follow = answer_function_call(client, "qwen3", TOOL, first, "sunny")
    assert call.name == "get_weather" and first.output_text == ""
    user = {"role": "user", "content": "What is the weather in Paris?"}
    assert first.usage.input_tokens == _hf_len(hf_tok, [user], tools=[CHAT_TOOL])
    assert follow.output_text == "It is sunny in Paris."
    history = [
        user,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "type": "function",
                    "id": call.call_id,
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"},
    ]
    assert follow.usage.input_tokens == _hf_len(hf_tok, history, tools=[CHAT_TOOL])


def test_responses_stream_reasoning_with_qwen3_template(scripted):
    _, client, _ = scripted
    with client.responses.stream(model="qwen3", input="Please ponder 2+2.", reasoning={"effort": "medium"}) as s:
        final = s.get_final_response()
    assert [i.type for i in final.output] == ["reasoning", "message"]
    assert final.output[0].content[0].text.strip() == "Two and two make four."
    assert final.output_text.strip() == "The answer is 4."


def test_messages_tools_and_thinking_with_qwen3_template(scripted, hf_tok):
    _, _, aclient = scripted
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    counted = aclient.messages.count_tokens(model="qwen3", messages=ask, tools=[ATOOL], system="Be brief.")
    want = _hf_len(hf_tok, [{"role": "system", "content": "Be brief."}, *ask], tools=[CHAT_TOOL], enable_thinking=False)
    assert counted.input_tokens == want
    with aclient.messages.stream(model="qwen3", max_tokens=128, messages=ask, tools=[ATOOL], system="Be brief.") as s:
        msg = s.get_final_message()
    assert msg.usage.input_tokens == want and msg.stop_reason == "tool_use"
    use, follow = answer_tool_use(aclient, "qwen3", ATOOL, ask, msg, [{"type": "text", "text": "sunny"}])
    assert use.input == {"city": "Paris"}
    assert follow.content[0].text == "It is sunny in Paris."
    think = aclient.messages.create(
        model="qwen3",
        max_tokens=128,
        thinking={"type": "enabled", "budget_tokens": 100},
        messages=[{"role": "user", "content": "Please ponder 2+2."}],
    )
    assert [b.type for b in think.content] == ["thinking", "text"]
    assert think.usage.input_tokens == _hf_len(
        hf_tok, [{"role": "user", "content": "Please ponder 2+2."}], enable_thinking=True
    )


@pytest.fixture(scope="module")
def random_qwen3(tmp_path_factory, start_server):
    from server_testlib import checkpoint_loader

    from metrale_core.plugin.discovery import load_registry
    from metrale_core.testing.random_checkpoint import write_random_checkpoint

    path = tmp_path_factory.mktemp("random-qwen3")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(QWEN3 / name, path / name)
    hf = write_random_checkpoint(path, tokenizer=False, vocab_size=151936, max_position_embeddings=1024)
    server, _ = start_server(
        loader=checkpoint_loader(path, load_registry(), block_size=16, max_prefill_tokens=256), served_model_name="rq3"
    )
    return server.url, hf


def test_random_qwen3_serves_all_three_apis(random_qwen3, hf_tok):
    url, hf = random_qwen3
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
    r = client.responses.create(model="rq3", input="Hello there", max_output_tokens=6, temperature=0, tools=[TOOL])
    assert r.status in ("completed", "incomplete") and r.usage.output_tokens <= 6
    assert r.usage.input_tokens == _hf_len(hf_tok, [{"role": "user", "content": "Hello there"}], tools=[CHAT_TOOL])
    a = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=120)
    with a.messages.stream(
        model="rq3", max_tokens=6, messages=[{"role": "user", "content": "Hello there"}], extra_body={"temperature": 0}
    ) as s:
        msg = s.get_final_message()
    assert msg.usage.output_tokens <= 6
    assert msg.usage.input_tokens == _hf_len(
        hf_tok, [{"role": "user", "content": "Hello there"}], enable_thinking=False
    )
    emb = client.embeddings.create(model="rq3", input=["Hello there", "Bonjour"], encoding_format="float")
    for d, text in zip(emb.data, ["Hello there", "Bonjour"]):
        ids = hf_tok(text)["input_ids"]
        with torch.no_grad():
            want = torch.nn.functional.normalize(
                hf.model(torch.tensor([ids])).last_hidden_state[0].mean(0), dim=0
            ).numpy()
        assert np.abs(np.asarray(d.embedding) - want).max() <= 1e-5
