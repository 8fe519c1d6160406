"""``StructuredOutput``: a request's output constraint (JSON Schema, regex, choice, grammar, forced
tool calls), carried from the server to the logit processor that enforces it.

Owner: the server builds one per request (``metrale_core.server.structured``) and puts it on
``SamplingParams.structured``; a logit-processor plugin that declares
``handles_structured_output = True`` (metrale-structured) compiles and enforces it.  The core
never interprets ``value``: it only refuses a constrained request when no installed processor
handles constraints (``LogitPipeline.validate``).

Invariants:
- ``kind`` is one of :data:`KINDS`; ``value`` is its canonical text (JSON text for the JSON kinds
  and ``tool_calls``, the pattern for ``regex``, a JSON list of strings for ``choice``, GBNF for
  ``grammar``, Lark for ``lark``); equal records compile to the same grammar.
- ``field`` names the request field it came from, so a rejection can name it.
"""

from __future__ import annotations

from attrs import field, frozen, validators

from metrale_core.errors import InvalidRequest

__all__ = ["KINDS", "StructuredOutput", "StructuredOutputError"]

#: The constraint kinds a structured-output processor is asked to enforce.
KINDS = ("json_schema", "regex", "choice", "grammar", "lark", "tool_calls")


class StructuredOutputError(InvalidRequest):
    """A constraint that cannot be enforced (bad schema, grammar that does not compile, ...).

    ``param`` is the request field to name in the 400 response.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@frozen
class StructuredOutput:
    """One request's output constraint."""

    kind: str = field(validator=validators.in_(KINDS))
    value: str = field(validator=validators.instance_of(str))
    #: The request field it came from (``response_format``, ``structured_outputs.regex``, ...).
    field: str = ""
    #: The model may think first: the constraint applies after this marker ends the reasoning
    #: section (None: from the first output token).
    reasoning_end: str | None = None
    #: The prompt already opened the reasoning section (the model starts inside it).
    starts_in_reasoning: bool = False
    #: Text that opens the reasoning section when the model starts outside it.
    reasoning_start: str | None = None
