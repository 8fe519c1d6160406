"""``template_adapt``: Phi-4-mini's tools in the system message, Mistral's 9-character tool-call
ids; other templates get the messages unchanged and the input is never mutated."""

from __future__ import annotations

import copy
import json

from metrale_core.server.template_adapt import adapt_messages, nine_char_id

PHI4 = "{{ '<|system|>' + message['content'] + '<|tool|>' + message['tools'] + '<|/tool|>' }}"
MISTRAL = "{%- if not tool_call.id is defined or tool_call.id|length != 9 %}{{ raise_exception('x') }}{% endif %}"
PLAIN = "{% for m in messages %}{{ m.content }}{% endfor %}"
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
TURN = [
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "go"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_abcdef0123456789", "function": {"name": "f"}}]},
    {"role": "tool", "tool_call_id": "call_abcdef0123456789", "content": "done"},
]


def test_phi4_tools_join_the_system_message_or_a_new_one():
    before = copy.deepcopy(TURN)
    out = adapt_messages(PHI4, TURN, [TOOL])
    assert before == TURN  # not mutated
    assert out[0]["content"] == "sys" and json.loads(out[0]["tools"]) == [TOOL["function"]]
    assert out[1:] == TURN[1:]
    alone = adapt_messages(PHI4, TURN[1:], [TOOL])
    assert alone[0] == {"role": "system", "content": "", "tools": json.dumps([TOOL["function"]])}
    assert adapt_messages(PHI4, TURN, None) is TURN  # no tools: nothing to add


def test_mistral_ids_are_mapped_consistently():
    out = adapt_messages(MISTRAL, TURN, [TOOL])
    new = out[2]["tool_calls"][0]["id"]
    assert len(new) == 9 and new.isalnum() and out[3]["tool_call_id"] == new
    assert nine_char_id("abc123XYZ") == "abc123XYZ"  # already the right shape: kept
    assert nine_char_id("call_1") != nine_char_id("call_2")
    assert TURN[2]["tool_calls"][0]["id"] == "call_abcdef0123456789"


def test_other_templates_are_left_alone():
    assert adapt_messages(PLAIN, TURN, [TOOL]) is TURN
    assert adapt_messages(None, TURN, [TOOL]) is TURN
