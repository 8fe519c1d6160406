"""The tool-call wire format a chat template asks the model for, read from the template's text.

Owner: the server's tool-call parser choice (``make_stream_parser`` and ``server.structured``'s
``tool_format``): ``--tool-call-parser``, else :func:`template_tool_format`, else the parser
registered for the model type, else ``hermes``.

Invariants:
- Pure text inspection of the template (no rendering); the markers are the ones each format's
  template writes into the system prompt or the assistant turn, tested most specific first
  (a Qwen3-Coder template also mentions ``<tool_call>``), so a template that describes tools in
  one format never picks another.
- None when the template names no known format (or there is no template): the caller falls back.
- :func:`tools_in_system_message`: the template reads the tools from the system message (Phi-4-mini's
  ``message['tools']`` inside ``<|tool|>...<|/tool|>``) instead of the ``tools`` variable.
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["TEMPLATE_MARKERS", "template_tool_format", "tools_in_system_message"]

#: (parser name, markers that must all appear in the template), most specific first.
TEMPLATE_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("harmony", ("<|channel|>", "<|message|>", "to=")),
    ("glm47", ("<arg_key>", "<arg_value>")),
    ("qwen3_coder", ("<function=", "<parameter=")),
    ("mistral", ("[TOOL_CALLS]",)),
    ("granite", ("<|tool_call|>",)),
    ("phi4_mini", ("<|tool|>", "<|/tool|>")),
    ("hermes", ("<tool_call>", "</tool_call>")),
)


@lru_cache(maxsize=8)
def template_tool_format(template: str | None) -> str | None:
    """The parser name whose markers ``template`` contains, or None."""
    if not template:
        return None
    for name, markers in TEMPLATE_MARKERS:
        if all(marker in template for marker in markers):
            return name
    return None


@lru_cache(maxsize=8)
def tools_in_system_message(template: str | None) -> bool:
    """Whether ``template`` renders tools from its system message's ``tools`` field (Phi-4-mini)."""
    if not template or "<|tool|>" not in template:
        return False
    return "message['tools']" in template or 'message["tools"]' in template or "message.tools" in template
