"""Random model output built from tag fragments: no parser ever raises, and chunking never matters."""

from __future__ import annotations

import json
import random

import pytest
from streamparse_helpers import parse, random_pieces

COMMON = [
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "\n",
    " ",
    "x",
    "<",
    ">",
    "/",
    "1",
    "<tool_",
    "call>",
    '"',
    "{",
    "}",
]
ATOMS = {
    "hermes": COMMON
    + [
        '{"name": "f", "arguments": {',
        '"a": ',
        '"s"',
        "[1, 2]",
        ", ",
        "}}",
        "\\",
        "\\n",
        '"name"',
        ":",
        "true",
        "-0.5",
        '"arguments"',
    ],
    "qwen3_coder": COMMON
    + [
        "<function=f>",
        "<parameter=a>",
        "</parameter>",
        "</function>",
        "<parameter=",
        "<function=",
        "n>",
        "</para",
        "meter>",
        "42",
        "null",
    ],
    "glm47": COMMON
    + ["f", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<arg_", "key>", "value>", "k", "3"],
    "mistral": COMMON + ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[TOOL_", "f", '{"a": 1}', "[", "]", '"name"', ":"],
    "granite": COMMON + ["<|tool_call|>", "<|tool_", "[", "]", '{"name": "f", "arguments": {', '"a": 1', "}}", ","],
    "phi4_mini": COMMON
    + ["<|tool_call|>", "<|/tool_call|>", "<|/tool", "[", "]", '{"name": "f"', ', "arguments": {}}'],
    "harmony": COMMON
    + [
        "<|start|>assistant",
        "<|channel|>",
        "<|message|>",
        "<|end|>",
        "<|call|>",
        "<|return|>",
        "<|constrain|>json",
        "analysis",
        "final",
        "commentary",
        " to=functions.f ",
        "<|chan",
        "nel|>",
        '{"a": 1}',
    ],
}
VALID = {
    "hermes": 'Hi <tool_call>\n{"name": "f", "arguments": {"a": 1, "n": {"s": "x\\"y"}}}\n</tool_call>\n'
    '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>',
    "qwen3_coder": "Hi <tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=n>\n"
    '{"s": 1}\n</parameter>\n<parameter=t>\nfree text\n</parameter>\n</function>\n'
    "</tool_call><tool_call>\n<function=g>\n</function>\n</tool_call>",
    "glm47": "Hi <tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value><arg_key>t</arg_key>"
    "<arg_value>free text</arg_value></tool_call><tool_call>g</tool_call>",
    "mistral": 'Hi [TOOL_CALLS]f[ARGS]{"a": 1, "n": {"s": "x\\"y"}}[TOOL_CALLS][{"name": "g", "arguments": {}}]',
    "granite": 'Hi <|tool_call|>[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]',
    "phi4_mini": 'Hi <|tool_call|>[{"name": "f", "arguments": {"a": 1}}]<|/tool_call|>',
    "harmony": "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>commentary"
    ' to=functions.f <|constrain|>json<|message|>{"a": 1}<|end|><|start|>assistant<|channel|>final'
    "<|message|>Hi<|return|>",
}
#: Formats whose markers structure all output (not just calls): their content is not the raw text.
CHANNELLED = {"harmony"}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "f", "parameters": {"properties": {"a": {"type": "integer"}, "n": {"type": "object"}}}},
    }
]


@pytest.mark.parametrize("fmt", sorted(ATOMS))
def test_random_output_never_raises_and_is_chunking_invariant(fmt):
    rng = random.Random(fmt)
    reasoning = "glm45" if fmt == "glm47" else "qwen3"
    for trial in range(300):
        if trial % 3:  # a valid output with a few random edits
            text = VALID[fmt]
            for _ in range(rng.randint(0, 3)):
                i, j = sorted(rng.randrange(len(text) + 1) for _ in range(2))
                edit = rng.choice(("delete", "insert", "cut"))
                if edit == "delete":
                    text = text[:i] + text[i + rng.randint(1, 3) :]
                elif edit == "insert":
                    text = text[:i] + rng.choice(ATOMS[fmt]) + text[i:]
                else:
                    text = text[:j]
        else:
            text = "".join(rng.choice(ATOMS[fmt]) for _ in range(rng.randint(1, 40)))
        kwargs = dict(tool_parser=fmt, tools=TOOLS, reasoning=reasoning if trial % 2 else None)
        whole, _parser = parse([text], **kwargs)
        for _ in range(4):
            assert parse(random_pieces(text, rng), **kwargs)[0] == whole, text
        assert parse(list(text), **kwargs)[0] == whole, text
        for _name, args in whole.tool_calls:  # completed calls are always valid JSON objects
            assert isinstance(json.loads(args), dict)
        # nothing is lost: without a well-formed call, the content is the model's text exactly
        if not whole.tool_calls and kwargs["reasoning"] is None and fmt not in CHANNELLED:
            assert whole.content == text
