"""gpt-oss's harmony format end to end: real uvicorn, the official ``openai`` client, a scripted
model whose tokenizer has harmony's markers as *special* tokens (so the engine must keep them for
the parser) and ``<|return|>`` / ``<|call|>`` as end-of-generation tokens.

The chat template is a compact one written from gpt-oss's official format (the real template's
rendering is checked in ``tests/text/test_family_templates.py``); the parser is picked from it.
"""

from __future__ import annotations

import json
import re

import pytest
from server_testlib import ASK, TOOLS, ScriptedLM, write_tokenizer

SPECIAL = [
    "<|endoftext|>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|return|>",
    "<|call|>",
]
HARMONY = (
    "<|start|>system<|message|>You are a test model.\nReasoning: {{ reasoning_effort or 'medium' }}\n\n"
    "# Valid channels: analysis, commentary, final.<|end|>"
    "{% if tools %}<|start|>developer<|message|># Tools\n\nnamespace functions {\n"
    "{% for t in tools %}type {{ t.function.name }} = (_: {{ t.function.parameters | tojson }}) => any;\n{% endfor %}"
    "} // namespace functions<|end|>{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'user' %}<|start|>user<|message|>{{ m.content }}<|end|>"
    "{% elif m.role == 'assistant' and m.tool_calls %}{% set c = m.tool_calls[0].function %}"
    "{% set ns.last = c.name %}"
    "<|start|>assistant to=functions.{{ c.name }}<|channel|>commentary json<|message|>"
    "{{ c.arguments | tojson }}<|call|>"
    "{% elif m.role == 'assistant' %}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>"
    "{% elif m.role == 'tool' %}<|start|>functions.{{ ns.last }} to=assistant<|channel|>commentary<|message|>"
    "{{ m.content | tojson }}<|end|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)
HARMONY = "{% set ns = namespace(last='') %}" + HARMONY
ANALYSIS = "<|channel|>analysis<|message|>The user wants the weather; call get_weather.<|end|>"
CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}<|call|>'
)
BROKEN = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{city: Paris}<|call|>"
)
FINAL = "<|start|>assistant<|channel|>final<|message|>It is sunny in Paris.<|return|>"


class HarmonyLM(ScriptedLM):
    """Answers harmony prompts (``<|start|>assistant`` ends them) with harmony replies."""

    EOS = "<|return|>"
    ASSISTANT = "<|start|>assistant"
    USER = "<|start|>user<|message|>"
    SCRIPTS = (
        ("weather", ANALYSIS + CALL),
        ("broken", ANALYSIS + BROKEN),
        (
            "ponder",
            "<|channel|>analysis<|message|>Two and two make four.<|end|>" + FINAL.replace("It is sunny in Paris.", "4"),
        ),
    )

    def _reply_start(self, history: list[int]) -> int | None:
        """After the first assistant header that follows the last user or tool message: a
        harmony reply repeats ``<|start|>assistant`` between its own messages."""
        text = self.tokenizer.decode(history, skip_special_tokens=False)
        turn = max(text.rfind(self.USER), text.rfind("to=assistant<|channel|>commentary<|message|>"))
        at = text.find(self.ASSISTANT, turn) if turn >= 0 else -1
        if at < 0:
            return None
        return self._tokens_in(text[: at + len(self.ASSISTANT)])

    def _reply(self, prompt: list[int]) -> list[int] | None:
        text = self.tokenizer.decode(prompt, skip_special_tokens=False)
        if text.endswith("<|end|><|start|>assistant") and "to=assistant<|channel|>commentary" in text[-200:]:
            reply = ANALYSIS.replace("call get_weather", "answer") + FINAL  # after the tool result
        elif "effort" in text.rsplit(self.USER, 1)[-1]:
            effort = re.search(r"Reasoning: (\w+)", text).group(1)
            reply = f"<|channel|>final<|message|>effort={effort}<|return|>"
        else:
            return super()._reply(prompt)
        return self.tokenizer.encode(reply, add_special_tokens=False)


@pytest.fixture(scope="module")
def harmony_client(start_server, tmp_path_factory):
    from server_testlib import serve_scripted_class

    from metrale_core.text.tokenizer import Tokenizer

    directory = tmp_path_factory.mktemp("harmonytok")
    write_tokenizer(directory, SPECIAL, [], HARMONY, eos="<|return|>", generation_eos=("<|call|>",))
    tokenizer = Tokenizer.from_dir(directory)
    assert tokenizer.token_to_id("<|call|>") in tokenizer.eos_token_ids
    return serve_scripted_class(start_server, tokenizer, HarmonyLM, "harmony-test", "gpt-oss-scripted")


def chat(client, messages, **kwargs):
    return client.chat.completions.create(model="gpt-oss-scripted", messages=messages, temperature=0, **kwargs)


def test_tool_call_and_reasoning(harmony_client):
    resp = chat(harmony_client, ASK, tools=TOOLS)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.model_extra["reasoning_content"] == "The user wants the weather; call get_weather."
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}


def test_streamed_deltas_rebuild_the_call_and_leak_no_marker(harmony_client):
    stream = chat(harmony_client, ASK, tools=TOOLS, stream=True)
    content = reasoning = args = ""
    names, finish = [], None
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        for tc in delta.tool_calls or []:
            names += [tc.function.name] if tc.function and tc.function.name else []
            args += (tc.function.arguments or "") if tc.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert content == "" and "<|" not in reasoning
    assert reasoning == "The user wants the weather; call get_weather."
    assert names == ["get_weather"] and json.loads(args) == {"city": "Paris"} and finish == "tool_calls"


def test_tool_result_round_trip(harmony_client):
    first = chat(harmony_client, ASK, tools=TOOLS).choices[0].message
    call = first.tool_calls[0]
    messages = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny"}'},
    ]
    resp = chat(harmony_client, messages, tools=TOOLS)
    assert resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].message.content == "It is sunny in Paris."
    assert resp.choices[0].message.model_extra["reasoning_content"] == "The user wants the weather; answer."


def test_reasoning_without_tools(harmony_client):
    msg = chat(harmony_client, [{"role": "user", "content": "ponder 2+2"}]).choices[0].message
    assert msg.content == "4" and msg.model_extra["reasoning_content"] == "Two and two make four."


def test_reasoning_effort_reaches_the_template(harmony_client):
    msg = (
        chat(harmony_client, [{"role": "user", "content": "which effort?"}], reasoning_effort="high").choices[0].message
    )
    assert msg.content == "effort=high"
    assert (
        chat(harmony_client, [{"role": "user", "content": "which effort?"}]).choices[0].message.content
        == "effort=medium"
    )


def test_responses_api_reasoning_item_and_effort(harmony_client):
    r = harmony_client.responses.create(model="gpt-oss-scripted", input="ponder 2+2")
    assert [i.type for i in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == "Two and two make four." and r.output_text == "4"
    low = harmony_client.responses.create(model="gpt-oss-scripted", input="which effort?", reasoning={"effort": "low"})
    assert low.output_text == "effort=low"


def test_malformed_call_is_content_not_an_error(harmony_client):
    resp = chat(harmony_client, [{"role": "user", "content": "a broken call please"}], tools=TOOLS)
    choice = resp.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert choice.message.content.endswith("<|message|>{city: Paris}")
    assert choice.message.model_extra["reasoning_content"].startswith("The user wants")


def test_forcing_a_call_in_harmony_is_a_clear_400(harmony_client):
    import openai

    with pytest.raises(openai.BadRequestError) as info:
        chat(harmony_client, ASK, tools=TOOLS, tool_choice="required")
    assert "format 'harmony'" in info.value.body["message"]
