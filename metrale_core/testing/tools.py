"""The weather tool the tests and benchmarks offer a model, in OpenAI's chat-completions form.

Owner: the server, template and benchmark tests that ask a model to call ``get_weather``.
Invariants: the same schema everywhere (one required string ``city``); only the description,
which ends up in rendered prompts, is the caller's.
"""

from __future__ import annotations

from typing import Any

__all__ = ["weather_tool"]


def weather_tool(description: str) -> dict[str, Any]:
    """A function tool ``get_weather(city: str)`` described as ``description``."""
    city = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    return {"type": "function", "function": {"name": "get_weather", "description": description, "parameters": city}}
