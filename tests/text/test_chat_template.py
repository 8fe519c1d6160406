"""Chat templates: SmolLM2's (from the GGUF) and Qwen3's (tools, thinking) rendered exactly as
transformers' ``apply_chat_template(tokenize=False)``; the sandbox helpers and error mapping."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

import pytest

from metrale_core.errors import ConfigError, InvalidRequest
from metrale_core.testing.requires import missing
from metrale_core.testing.smollm2 import CAPITAL_CHAT_IDS
from metrale_core.testing.tools import weather_tool
from metrale_core.text.chat_template import render_chat_template
from metrale_core.text.tokenizer import Tokenizer

SMOL = Path.home() / ".cache" / "metrale" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
QWEN3 = Path(os.environ.get("METRALE_QWEN3_TOKENIZER_DIR") or Path.home() / ".cache/metrale/tokenizers/qwen3")
CHAT_IDS = list(CAPITAL_CHAT_IDS)

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi!"}],
    [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "and 3+3?"},
    ],
    [{"role": "user", "content": "Unicode: 日本語 😀 naïve\n\n  indented\ttab"}],
    [
        {"role": "system", "content": ""},
        {"role": "user", "content": "empty system"},
        {"role": "assistant", "content": "ok", "tool_calls": None},
    ],
]

WEATHER_TOOL = weather_tool("Weather for a city — °C")
TOOL_CHAT = [
    {"role": "system", "content": "You can call tools."},
    {"role": "user", "content": "Weather in Zürich?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Need the tool.",
        "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}],
    },
    {"role": "tool", "content": '{"temp": 21}'},
    {"role": "assistant", "content": "21 °C.", "thinking": "Easy."},
    {"role": "user", "content": "Thanks"},
]


@pytest.fixture(scope="module")
def smol_pair():
    import transformers

    if not SMOL.is_file():
        missing(f"{SMOL} absent")
    hf = transformers.AutoTokenizer.from_pretrained(str(SMOL.parent), gguf_file=SMOL.name)
    return Tokenizer.from_gguf(SMOL), hf


@pytest.fixture(scope="module")
def qwen3_pair():
    import transformers

    if not (QWEN3 / "tokenizer.json").is_file():
        missing(f"no Qwen3 tokenizer in {QWEN3} (scripts/fetch-test-data.sh)")
    return Tokenizer.from_dir(QWEN3), transformers.AutoTokenizer.from_pretrained(str(QWEN3))


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_smollm2_template_matches_transformers(smol_pair, add_generation_prompt):
    ours, hf = smol_pair
    for conv in CONVERSATIONS:
        expected = hf.apply_chat_template(conv, tokenize=False, add_generation_prompt=add_generation_prompt)
        assert ours.apply_chat_template(conv, add_generation_prompt=add_generation_prompt) == expected


def test_smollm2_chat_ids_are_the_reference(smol_pair):
    ours, hf = smol_pair
    conv = CONVERSATIONS[0]
    assert ours.encode_chat(conv) == CHAT_IDS
    assert list(hf.apply_chat_template(conv, tokenize=True, add_generation_prompt=True, return_dict=False)) == CHAT_IDS


@pytest.mark.parametrize("enable_thinking", [True, False, None])
@pytest.mark.parametrize("with_tools", [True, False])
def test_qwen3_template_matches_transformers(qwen3_pair, enable_thinking, with_tools):
    ours, hf = qwen3_pair
    tools = [WEATHER_TOOL] if with_tools else None
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    for conv in (TOOL_CHAT, CONVERSATIONS[2], CONVERSATIONS[3]):
        expected = hf.apply_chat_template(conv, tools=tools, tokenize=False, add_generation_prompt=True, **kwargs)
        got = ours.apply_chat_template(conv, tools=tools, **kwargs)
        assert got == expected
    if enable_thinking is False:
        assert got.endswith("<think>\n\n</think>\n\n")


def test_qwen3_template_rejects_bad_conversation(qwen3_pair):
    ours, _ = qwen3_pair
    with pytest.raises(InvalidRequest, match=r"failed on this conversation .UndefinedError"):
        ours.apply_chat_template([])


# ---- the environment itself --------------------------------------------------------------------


def _render(template, messages=(), **kwargs):
    return render_chat_template(template, list(messages), **kwargs)


def test_raise_exception_becomes_invalid_request():
    t = "{% if messages[0].role != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}ok"
    assert _render(t, [{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(InvalidRequest, match="rejected the conversation: first message must be from the user"):
        _render(t, [{"role": "assistant", "content": "x"}])


def test_syntax_error_is_a_config_error():
    with pytest.raises(ConfigError, match="not valid Jinja"):
        _render("{% for m in messages %}{{ m }")


def test_sandbox_violations_are_invalid_requests():
    with pytest.raises(InvalidRequest, match="sandbox"):
        _render("{{ messages.__class__.__mro__ }}")
    with pytest.raises(InvalidRequest, match="sandbox"):
        _render("{% set ns = namespace(_secret=1) %}")
    with pytest.raises(InvalidRequest, match="sandbox"):
        _render("{% set _ = messages.append(1) %}")  # immutable environment


def test_tojson_is_unescaped_and_supports_indent():
    data = {"city": "Zürich", "tag": "<b>&"}
    assert _render("{{ x | tojson }}", x=data) == '{"city": "Zürich", "tag": "<b>&"}'
    assert _render("{{ x | tojson(indent=2) }}", x={"a": 1}) == '{\n  "a": 1\n}'
    assert _render("{{ x | tojson(ensure_ascii=True) }}", x="ü") == '"\\u00fc"'


def test_strftime_now_and_kwargs():
    assert _render("{{ strftime_now('%Y') }}") == str(datetime.now().year)
    t = "{% if enable_thinking is defined and not enable_thinking %}no-think{% else %}think{% endif %}"
    assert _render(t) == "think" and _render(t, enable_thinking=False) == "no-think"


def test_trim_blocks_loopcontrols_generation_tag_and_none_keys():
    t = (
        "{% for m in messages %}\n"
        "  {% if loop.index > 2 %}{% break %}{% endif %}\n"
        "{% generation %}{{ m.role }}{% if m.content is defined %}={{ m.content }}{% endif %};{% endgeneration %}\n"
        "{% endfor %}\n"
        "{{ tools | length if tools else 'no tools' }}|{{ documents }}|{{ add_generation_prompt }}"
    )
    msgs = [{"role": "a", "content": None}, {"role": "b", "content": "x"}, {"role": "c", "content": "y"}]
    assert _render(t, msgs, add_generation_prompt=False) == "a;b=x;no tools|None|False"
    assert _render(t, msgs[:1], tools=[WEATHER_TOOL]).endswith("1|None|True")


def test_reasoning_aliases_and_bad_inputs():
    t = "{{ messages[0].reasoning_content }}/{{ messages[0].thinking }}"
    assert _render(t, [{"role": "assistant", "content": "", "reasoning": "r"}]) == "r/r"
    with pytest.raises(InvalidRequest, match="chat messages must be objects"):
        _render("x", ["not a dict"])
    with pytest.raises(InvalidRequest, match="tools must be JSON-schema objects"):
        _render("x", [], tools=["get_weather"])
    with pytest.raises(InvalidRequest, match="failed on this conversation"):
        _render("{{ messages[0]['content'] + 1 }}", [{"role": "user", "content": "x"}])


def test_a_loop_with_an_empty_body_stops_at_the_time_budget():
    """No call, attribute or operator inside the loops: only the per-line check can stop it (it
    would run ~10^10 empty iterations).  The budget counts CPU time, so the wall time it takes
    depends on the machine's load: the outcome (stopped, by the budget) is checked, with a
    deadline so generous that only a render the budget failed to stop can miss it."""
    import threading

    template = "{% set xs = range(100000)|list %}{% for i in xs %}{% for j in xs %}{% endfor %}{% endfor %}"
    result = {}

    def render():
        try:
            render_chat_template(template, [{"role": "user", "content": "hi"}], time_budget_s=0.3)
        except InvalidRequest as exc:
            result["error"] = str(exc)

    thread = threading.Thread(target=render, daemon=True)
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), "the render ran past its time budget"
    assert "time budget" in result["error"]


def test_the_time_budget_counts_the_renders_cpu_time_not_waiting():
    """On a busy server a good render may wait for the interpreter lock or a core far longer than
    it computes; only the CPU time it burns counts.  Here the render is held up 0.5 s (a tracer
    that sleeps once, inside the render) on a 0.2 s budget, and still completes."""
    import sys
    import time

    slept = []

    def tracer(frame, event, arg):
        if frame.f_code.co_name == "_tick" and not slept:
            slept.append(time.sleep(0.5))
        return None

    sys.settrace(tracer)
    try:
        text = render_chat_template(
            "{% for m in messages %}{{ m.content }}{% endfor %}", [{"role": "user", "content": "hi"}], time_budget_s=0.2
        )
    finally:
        sys.settrace(None)
    assert slept and text == "hi"


def test_the_line_check_keeps_a_tracer_already_set():
    import sys

    seen = []

    def tracer(frame, event, arg):
        seen.append(frame.f_code.co_name)
        return None

    sys.settrace(tracer)
    try:
        text = render_chat_template(
            "{% for m in messages %}{{ m.content }}{% endfor %}", [{"role": "user", "content": "hi"}]
        )
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(None)
    assert text == "hi"
    assert "root" not in seen  # the template's own frames are traced by the line check
    assert "_tick" in seen  # other frames during the render still reach the tracer
