"""metrale-mistral-tools: the ``mistral`` tool-call parser, as a Metrale plugin.

Owner: this module is the plugin (entry point ``metrale: mistral-tools``); the parser lives in
:mod:`metrale_mistral_tools.parser`.

Invariants: importing this module imports nothing heavy; the server builds one parser per
sequence through ``ToolCallParserSpec.factory(tools=...)``.
"""

from __future__ import annotations

from metrale_core import hookimpl
from metrale_core.api import ToolCallParserSpec, lazy_factory

__all__ = ["metrale_tool_call_parsers"]


@hookimpl
def metrale_tool_call_parsers(register):
    register(
        ToolCallParserSpec(
            name="mistral",
            factory=lazy_factory("metrale_mistral_tools.parser:MistralToolParser"),
            model_types=("mistral", "mistral3"),
            description="Mistral v11+ [TOOL_CALLS]name[ARGS]{json}",
        )
    )
