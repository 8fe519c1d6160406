"""``translate.call_arguments``: a tool call's gathered arguments as the JSON object the
Anthropic and Ollama APIs send, ``{}`` for anything that is not one."""

from __future__ import annotations

import pytest

from metrale_core.server.translate import call_arguments


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"city": "Paris", "days": 2}', {"city": "Paris", "days": 2}),
        ("", {}),
        ('{"city": "Par', {}),
        ("[1, 2]", {}),
        ('"text"', {}),
    ],
)
def test_call_arguments(arguments, expected):
    assert call_arguments(arguments) == expected
