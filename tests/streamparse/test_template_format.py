"""The tool-call parser picked from the chat template's text (``template_tool_format``) and the
order of the default choice (``default_tool_parser``): template, then model type, then hermes."""

from __future__ import annotations

import pytest

from metrale_core.streamparse import BUILTIN_TOOL_PARSERS, make_stream_parser
from metrale_core.streamparse.parser import default_tool_parser
from metrale_core.streamparse.template_format import template_tool_format, tools_in_system_message

# the tool sections of the real templates, abridged
QWEN25 = (
    "{%- if tools %}# Tools\nYou are provided with function signatures within <tools></tools>"
    " XML tags:\n<tools>{{ tool | tojson }}</tools>\nFor each function call, return a json "
    "object with function name and arguments within <tool_call></tool_call> XML tags:\n"
    '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
QWEN3_CODER = (
    QWEN25 + "<tool_call>\n<function=example_function_name>\n<parameter=example_"
    "parameter_1>\nvalue_1\n</parameter>\n</function>\n</tool_call>"
)
GLM = "<tool_call>{{ tc.name }}<arg_key>{{ k }}</arg_key><arg_value>{{ v }}</arg_value></tool_call>"
MISTRAL = "{{- '[TOOL_CALLS]' + tool_call.function.name + '[ARGS]' }}"
HARMONY = '{{- "<|start|>assistant to=functions." + name + "<|channel|>commentary json<|message|>" }}'
GRANITE = "respond only with <|tool_call|> followed by a JSON list of tools used."
PHI4 = "{{ '<|system|>' + message['content'] + '<|tool|>' + message['tools'] + '<|/tool|>' }}"
PLAIN = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
TYPES = {n: t for n, (_, t) in BUILTIN_TOOL_PARSERS.items()}


@pytest.mark.parametrize(
    ("template", "name"),
    [
        (QWEN25, "hermes"),
        (QWEN3_CODER, "qwen3_coder"),
        (GLM, "glm47"),
        (MISTRAL, "mistral"),
        (HARMONY, "harmony"),
        (GRANITE, "granite"),
        (PHI4, "phi4_mini"),
        (PLAIN, None),
        ("", None),
        (None, None),
    ],
)
def test_template_tool_format(template, name):
    assert template_tool_format(template) == name


def test_template_comes_before_model_type_and_hermes_is_last():
    assert default_tool_parser(TYPES, "qwen2", QWEN3_CODER) == "qwen3_coder"
    assert default_tool_parser(TYPES, "qwen3_coder", QWEN25) == "hermes"
    assert default_tool_parser(TYPES, "glm4_moe", PLAIN) == "glm47"  # no marker: by model type
    assert default_tool_parser(TYPES, "llama", None) == "hermes"
    assert default_tool_parser(TYPES, "mistral", PLAIN) == "mistral"
    assert default_tool_parser(TYPES, "gpt_oss", None) == "harmony"
    assert default_tool_parser(TYPES, "smollm3", None) == "hermes"
    # a format whose parser is not installed falls through to the model type
    installed = {n: t for n, t in TYPES.items() if n != "mistral"}
    assert default_tool_parser(installed, "glm4_moe", MISTRAL) == "glm47"


def test_make_stream_parser_uses_the_template_format():
    text = "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    parser = make_stream_parser(tools=tools, model_type="qwen2", chat_template=QWEN3_CODER)
    deltas = parser.feed("<tool_call>\n" + text + "</tool_call>") + parser.finish()
    assert [d.name for d in deltas if d.name] == ["get_weather"]
    assert not "".join(d.content for d in deltas).strip()


def test_tools_in_system_message_only_for_templates_that_read_them_there():
    assert tools_in_system_message(PHI4)
    assert not tools_in_system_message(QWEN25) and not tools_in_system_message(None)
    assert not tools_in_system_message("<|tool|>{{ tools | tojson }}<|/tool|>")
