"""Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF) behind ``met serve``'s own loader with default flags:
tool calls through the official openai client with no ``--tool-call-parser`` (the hermes format
is read from the GGUF's chat template), and a Python function that parses.

With ``tool_choice="auto"`` this 0.5B model answers a tool request with the bare JSON object
(no ``<tool_call>`` tags), which no hermes parser reads as a call; ``tool_choice="required"``
makes the server constrain the output to the template's format (hermes), so the call is the
format the template picked, parsed by the parser it picked."""

from __future__ import annotations

import ast
import json
import re

import pytest

from metrale_core.testing.requires import missing
from metrale_core.testing.tools import weather_tool

# loading the 0.5B model in the exact format takes minutes on a busy 2-core machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

WEATHER_TOOL = weather_tool("Get the current weather in a city")


@pytest.fixture(scope="module")
def qwen_server(start_server):
    from metrale_core.cli.main import build_parser
    from metrale_core.cli.serve import build_loader
    from metrale_core.plugin.discovery import load_registry
    from metrale_core.testing.chunked_weights import QWEN25_CODER_05B_Q4_K_M, fetch

    try:
        path = fetch(QWEN25_CODER_05B_Q4_K_M)
    except Exception as exc:  # no network and no cache: missing, not an error
        missing(f"Qwen2.5-Coder-0.5B could not be fetched ({exc})")
    registry = load_registry()
    args = build_parser(registry).parse_args(["serve", str(path)])  # met serve's defaults
    served = build_loader(args, registry, str(path))()  # loaded before: it may take minutes
    server, host = start_server(loader=lambda: served, registry=registry, served_model_name="qwen")
    assert host.config.tool_call_parser is None
    return server, host


def _client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=600)


def test_tool_calls_without_a_parser_flag(qwen_server):
    from metrale_core.server.structured import tool_format

    server, host = qwen_server
    assert host.served.model_type == "qwen2"
    assert "<tool_call>" in host.served.tokenizer.chat_template
    assert tool_format(host) == "hermes"
    client = _client(server)
    messages = [{"role": "user", "content": "What is the weather like in Paris right now?"}]
    request = {
        "model": "qwen",
        "messages": messages,
        "tools": [WEATHER_TOOL],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "temperature": 0,
        "max_tokens": 64,
    }
    resp = client.chat.completions.create(**request)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"].lower().startswith("paris")
    assert not (choice.message.content or "").strip()
    stream = client.chat.completions.create(**request, stream=True)
    names, args, finish = [], [], None
    for chunk in stream:
        for tc in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            if tc.function.name:
                names.append(tc.function.name)
            args.append(tc.function.arguments or "")
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert names == ["get_weather"] and finish == "tool_calls"
    assert json.loads("".join(args)) == json.loads(call.function.arguments)


def test_writes_a_python_function_that_parses(qwen_server):
    server, _ = qwen_server
    resp = _client(server).chat.completions.create(
        model="qwen",
        temperature=0,
        max_tokens=200,
        messages=[
            {
                "role": "user",
                "content": "Write a Python function is_prime(n) that returns "
                "True when n is a prime number. Reply with code only.",
            }
        ],
    )
    text = resp.choices[0].message.content
    blocks = re.findall(r"```(?:python)?\n(.*?)```", text, re.S)
    code = blocks[0] if blocks else text
    tree = ast.parse(code)
    funcs = [node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)]
    assert "is_prime" in funcs, code
    namespace: dict = {}
    exec(compile(tree, "<qwen>", "exec"), namespace)  # the model's own function
    assert [n for n in range(30) if namespace["is_prime"](n)] == [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]
