"""Mistral's ``[TOOL_CALLS]`` end to end: real uvicorn, the official ``openai`` client, a scripted
model whose tokenizer has Mistral's control tokens as *special* tokens, and a template written from
Mistral-Nemo's format (it refuses tool-call ids that are not 9 characters, as the real one does;
the real template's rendering is checked in ``tests/text/test_family_templates.py``).

The parser is picked from the template, not the model type (a Mistral-Nemo GGUF says ``llama``).
"""

from __future__ import annotations

import json

import pytest
from server_testlib import ScriptedLM, write_tokenizer

SPECIAL = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]"]
SPECIAL += ["[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[ARGS]"]
NEMO = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m.role == 'user' %}{% if tools and loop.last %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]"
    "{% endif %}[INST]{{ m.content }}[/INST]"
    "{% elif m.tool_calls %}[TOOL_CALLS][{% for c in m.tool_calls %}"
    "{% if c.id|length != 9 %}{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}"
    '{% endif %}{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}, '
    '"id": "{{ c.id }}"}{% if not loop.last %}, {% endif %}{% endfor %}]</s>'
    "{% elif m.role == 'assistant' %}{{ m.content }}</s>"
    "{% elif m.role == 'tool' %}"
    "{% if m.tool_call_id|length != 9 %}{{ raise_exception('Tool call IDs should be alphanumeric strings "
    "with length 9!') }}"
    '{% endif %}[TOOL_RESULTS]{"content": {{ m.content }}, "call_id": "{{ m.tool_call_id }}"}[/TOOL_RESULTS]'
    "{% endif %}{% endfor %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]


class MistralLM(ScriptedLM):
    """Answers after ``[/INST]`` (or ``[/TOOL_RESULTS]``) with Mistral tool calls or text."""

    EOS = "</s>"
    ASSISTANT = "[/INST]"
    USER = "[INST]"
    SCRIPTS = (
        (
            "both",
            '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}, '
            '{"name": "get_time", "arguments": {}, "id": "f5g6h7i8j"}]',
        ),
        ("weather", '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}'),
        ("broken", "Sure.[TOOL_CALLS]get_weather[ARGS]{city: Oslo}"),
    )

    def _reply_start(self, history: list[int]) -> int | None:
        text = self.tokenizer.decode(history, skip_special_tokens=False)
        at = max(text.rfind(t) + len(t) if t in text else -1 for t in ("[/INST]", "[/TOOL_RESULTS]"))
        return self._tokens_in(text[:at]) if at >= 0 else None

    def _reply(self, prompt: list[int]) -> list[int] | None:
        text = self.tokenizer.decode(prompt, skip_special_tokens=False)
        if text.endswith("[/TOOL_RESULTS]"):
            return self.tokenizer.encode("It is sunny in Oslo.", add_special_tokens=False)
        return super()._reply(prompt)


@pytest.fixture(scope="module")
def mistral_client(start_server, tmp_path_factory):
    from server_testlib import serve_scripted_class

    from metrale_core.text.tokenizer import Tokenizer

    directory = tmp_path_factory.mktemp("mistraltok")
    tokenizer = Tokenizer.from_dir(write_tokenizer(directory, SPECIAL, [], NEMO, eos="</s>"))
    return serve_scripted_class(start_server, tokenizer, MistralLM, "llama", "nemo-scripted")


def chat(client, content_or_messages, **kwargs):
    messages = content_or_messages
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    return client.chat.completions.create(
        model="nemo-scripted", messages=messages, temperature=0, tools=TOOLS, **kwargs
    )


def test_v3_list_of_two_calls(mistral_client):
    choice = chat(mistral_client, "both please").choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
    assert calls == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert all(len(c.id) == 9 and c.id.isalnum() for c in choice.message.tool_calls)


def test_v11_form_streams_and_the_ids_round_trip_through_the_template(mistral_client):
    names, args, ids = [], "", set()
    for chunk in chat(mistral_client, "weather in Oslo?", stream=True):
        for tc in chunk.choices[0].delta.tool_calls or []:
            ids.add(tc.id) if tc.id else None
            names += [tc.function.name] if tc.function and tc.function.name else []
            args += (tc.function.arguments or "") if tc.function else ""
    assert names == ["get_weather"] and json.loads(args) == {"city": "Oslo"}
    (call_id,) = ids
    for given in (call_id, "call_0123456789abcdef"):  # ours, and an OpenAI-style id from elsewhere
        messages = [
            {"role": "user", "content": "weather in Oslo?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": given, "type": "function", "function": {"name": "get_weather", "arguments": args}}
                ],
            },
            {"role": "tool", "tool_call_id": given, "content": '{"sky": "sunny"}'},
        ]
        resp = chat(mistral_client, messages)
        assert resp.choices[0].message.content == "It is sunny in Oslo."


def test_malformed_call_is_content(mistral_client):
    choice = chat(mistral_client, "broken").choices[0]
    assert choice.message.content == "Sure.[TOOL_CALLS]get_weather[ARGS]{city: Oslo}"


def test_forcing_a_call_in_this_format_is_a_clear_400(mistral_client):
    import openai

    with pytest.raises(openai.BadRequestError) as info:
        chat(mistral_client, "weather in Oslo?", tool_choice="required")
    assert "format 'mistral'" in info.value.body["message"]
