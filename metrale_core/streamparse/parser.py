"""``StreamParser``: reasoning split + tool-call parsing of one sequence's generated text.

Owner: the frontend builds one per sequence with :func:`make_stream_parser` and hands it to the
engine as ``extras={"stream_parser": parser}``; the engine's output processor feeds it every text
delta (after stop-string hold-back) in the engine thread, calls ``finish()`` when the sequence
ends and puts the deltas on ``RequestOutput.parsed``.  The B1 observer reads its state properties
from ``row.extras["stream_parser"]`` while the next position is sampled.

Invariants:
- Any split of the same text over ``feed`` calls gives the same concatenated ``content``, the same
  concatenated ``reasoning``, the same tool calls (index, name) and the same concatenated
  ``arguments`` per call index.  Adjacent pieces of the same kind are merged.
- The first piece of a tool call carries ``tool_call_index``, ``tool_call_id`` (``call_<16 hex>``,
  unique per call) and ``name``; later pieces carry the index and an ``arguments`` fragment.
- Text inside the reasoning span never reaches the tool-call parser, so it is never a tool call
  and never a parameter body.
- ``finish()`` never raises on model output; a second call returns ``[]``; ``feed`` after it
  raises :class:`StreamParserClosed`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING

from metrale_core.errors import ConfigError, MetraleError
from metrale_core.streamparse.base import ParsedDelta, ToolCallParser
from metrale_core.streamparse.reasoning import REASONING_FORMATS, ReasoningSplitter

if TYPE_CHECKING:
    from metrale_core.plugin.registry import Registry

__all__ = [
    "BUILTIN_TOOL_PARSERS",
    "StreamParser",
    "StreamParserClosed",
    "default_reasoning",
    "make_stream_parser",
    "new_tool_call_id",
]

#: Built-in parsers: name -> (factory target, default model types).  ``builtins.py`` registers
#: them through the hook; :func:`make_stream_parser` falls back to this table without a registry.
BUILTIN_TOOL_PARSERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "hermes": (
        "metrale_core.streamparse.hermes:HermesParser",
        ("qwen3", "qwen2", "qwen3_moe", "qwen2_moe", "qwen3_next", "smollm3"),
    ),
    "qwen3_coder": ("metrale_core.streamparse.qwen3_coder:Qwen3CoderParser", ("qwen3_coder", "qwen3_5", "qwen3_5_moe")),
    "glm47": ("metrale_core.streamparse.glm47:Glm47Parser", ("glm5_next", "glm_moe_dsa", "glm4_moe")),
    "mistral": ("metrale_core.streamparse.mistral:MistralToolParser", ("mistral", "mistral3")),
    "granite": ("metrale_core.streamparse.jsoncalls:GraniteParser", ("granite",)),
    "phi4_mini": ("metrale_core.streamparse.jsoncalls:Phi4MiniParser", ("phi3",)),
    "harmony": ("metrale_core.streamparse.harmony:HarmonyParser", ("gpt_oss", "gpt-oss")),
}
#: The format whose one parser also splits reasoning (its channels say what each text is).
HARMONY = "harmony"
#: ``tool_parser="none"`` turns tool-call parsing off (content and reasoning only).
NO_TOOL_PARSER = "none"


class StreamParserClosed(MetraleError):
    """``feed`` was called after ``finish``."""


def new_tool_call_id() -> str:
    """A fresh OpenAI-style tool-call id: ``call_`` and 16 hex digits."""
    return "call_" + secrets.token_hex(8)


class StreamParser:
    """One sequence's streaming parser: reasoning first, then tool calls."""

    def __init__(
        self,
        tool_parser: ToolCallParser | None = None,
        reasoning: ReasoningSplitter | None = None,
        id_factory: Callable[[], str] = new_tool_call_id,
    ) -> None:
        self.tool_parser = tool_parser
        self.reasoning = reasoning
        self.id_factory = id_factory
        self._ids: dict[int, str] = {}
        self._closed = False

    # --- B1 state ----------------------------------------------------------------------------
    @property
    def in_reasoning(self) -> bool:
        if self.reasoning is None:  # a parser that splits reasoning itself (harmony) says so
            return bool(getattr(self.tool_parser, "in_reasoning", False))
        return self.reasoning.in_reasoning

    @property
    def keeps_special_tokens(self) -> bool:
        """Whether the tool parser reads markers that are special tokens (the engine must keep
        them in the text it decodes for this sequence)."""
        return bool(getattr(self.tool_parser, "keeps_special_tokens", False))

    @property
    def inside_tool_call(self) -> bool:
        return self.tool_parser is not None and self.tool_parser.inside_tool_call

    @property
    def inside_parameter_body(self) -> bool:
        return self.tool_parser is not None and self.tool_parser.inside_parameter_body

    @property
    def param_body_chars_emitted(self) -> int:
        if self.tool_parser is None or not self.tool_parser.inside_parameter_body:
            return 0
        return self.tool_parser.param_body_chars_emitted

    @property
    def tool_calls(self) -> list[dict]:
        """Completed well-formed calls so far: ``[{"id", "name", "arguments"}]`` (arguments: JSON)."""
        if self.tool_parser is None:
            return []
        return [
            {"id": self._id(c.index), "name": c.name, "arguments": c.arguments}
            for c in self.tool_parser.completed_calls
        ]

    # --- streaming ---------------------------------------------------------------------------
    def feed(self, text: str) -> list[ParsedDelta]:
        if self._closed:
            raise StreamParserClosed("StreamParser.feed() after finish(); build a new parser for each sequence")
        if not text:
            return []
        if self.reasoning is None:
            return self._merge(self._tools(text))
        return self._merge(self._route(self.reasoning.feed(text)))

    def finish(self) -> list[ParsedDelta]:
        if self._closed:
            return []
        self._closed = True
        out = self._route(self.reasoning.finish()) if self.reasoning is not None else []
        if self.tool_parser is not None:
            out += self.tool_parser.finish()
        return self._merge(out)

    # --- internals ---------------------------------------------------------------------------
    def _route(self, segments: list[tuple[str, str]]) -> list[ParsedDelta]:
        out: list[ParsedDelta] = []
        for kind, text in segments:
            if kind == "reasoning":
                out.append(ParsedDelta(reasoning=text))
            else:
                out += self._tools(text)
        return out

    def _tools(self, text: str) -> list[ParsedDelta]:
        if self.tool_parser is None:
            return [ParsedDelta(content=text)]
        return self.tool_parser.feed(text)

    def _id(self, index: int) -> str:
        if index not in self._ids:
            self._ids[index] = self.id_factory()
        return self._ids[index]

    def _merge(self, deltas: list[ParsedDelta]) -> list[ParsedDelta]:
        out: list[ParsedDelta] = []
        for d in deltas:
            if d.name is not None and d.tool_call_id is None:
                assert d.tool_call_index is not None  # a delta with a name is a call's header
                d = ParsedDelta(
                    tool_call_index=d.tool_call_index,
                    tool_call_id=self._id(d.tool_call_index),
                    name=d.name,
                    arguments=d.arguments,
                )
            last = out[-1] if out else None
            if last is not None and _mergeable(last, d):
                out[-1] = ParsedDelta(
                    content=last.content + d.content,
                    reasoning=last.reasoning + d.reasoning,
                    tool_call_index=last.tool_call_index,
                    tool_call_id=last.tool_call_id,
                    name=last.name,
                    arguments=last.arguments + d.arguments,
                )
            elif d.content or d.reasoning or d.arguments or d.name is not None:
                out.append(d)
        return out


def _mergeable(a: ParsedDelta, b: ParsedDelta) -> bool:
    if b.name is not None:
        return False
    if a.tool_call_index is None and b.tool_call_index is None:
        return bool(a.content) == bool(b.content) and bool(a.reasoning) == bool(b.reasoning)
    return a.tool_call_index == b.tool_call_index


def default_reasoning(model_type: str | None, chat_template: str | None = None) -> str | None:
    """The reasoning format a model uses by default (None: no reasoning split): ``harmony``
    when the chat template writes harmony, else by model type."""
    from metrale_core.streamparse.template_format import template_tool_format

    if template_tool_format(chat_template) == HARMONY:
        return HARMONY
    if not model_type:
        return None
    if model_type.startswith("qwen3"):
        return "qwen3"
    if model_type.startswith("glm"):
        return "glm45"
    if model_type.startswith("smollm3"):
        return "think"
    if model_type == "granite":  # thinking=True: <think>...</think><response>...</response>
        return "granite"
    if model_type in ("gpt_oss", "gpt-oss"):
        return HARMONY
    return None


def default_tool_parser(
    types: dict[str, tuple[str, ...]], model_type: str | None, chat_template: str | None = None
) -> str:
    """The tool-call parser when none is configured: the format the chat template asks for
    (when that parser is installed), else the parser whose ``model_types`` lists
    ``model_type``, else ``hermes``.  ``types``: installed parser name -> its model types."""
    from metrale_core.streamparse.template_format import template_tool_format

    sniffed = template_tool_format(chat_template)
    if sniffed is not None and sniffed in types:
        return sniffed
    return next((n for n, t in sorted(types.items()) if model_type in t), "hermes")


def _tool_factory(
    registry: Registry | None, name: str | None, model_type: str | None, chat_template: str | None = None
) -> Callable | None:
    if registry is not None:
        specs = {n: (s.factory, tuple(s.model_types)) for n, s in registry.tool_call_parsers.items()}
    else:
        from metrale_core.plugin.discovery import lazy_factory

        specs = {n: (lazy_factory(t), types) for n, (t, types) in BUILTIN_TOOL_PARSERS.items()}
    if name == NO_TOOL_PARSER:
        return None
    if name is None:
        name = default_tool_parser({n: t for n, (_, t) in specs.items()}, model_type, chat_template)
    if name not in specs:
        known = ", ".join(sorted(specs)) or "none"
        raise ConfigError(
            f"no tool-call parser named {name!r} is installed (installed: {known}; "
            f"'{NO_TOOL_PARSER}' turns tool-call parsing off)"
        )
    return specs[name][0]


def make_stream_parser(
    registry: Registry | None = None,
    *,
    tool_parser: str | None = None,
    reasoning: str | None = None,
    tools: list[dict] | None = None,
    model_type: str | None = None,
    starts_in_reasoning: bool = False,
    id_factory: Callable[[], str] = new_tool_call_id,
    chat_template: str | None = None,
) -> StreamParser:
    """Build one sequence's :class:`StreamParser`.

    ``tool_parser``: a registered parser name, ``"none"``, or None to pick the format
    ``chat_template`` asks for, else the parser whose ``model_types`` lists ``model_type``
    (else ``hermes``; see :func:`default_tool_parser`).  ``reasoning``: None (no split), a name
    of :data:`~metrale_core.streamparse.reasoning.REASONING_FORMATS`, or ``"auto"`` (by
    ``model_type``, see :func:`default_reasoning`).  ``starts_in_reasoning``: the prompt already
    opened ``<think>``.  ``tools``: the request's OpenAI tools (parameter types for conversion).
    ``registry``: a ``metrale_core.plugin.discovery.Registry``; None uses the built-in parsers only.
    """
    if reasoning == "auto":
        reasoning = default_reasoning(model_type, chat_template)
    factory = _tool_factory(registry, tool_parser, model_type, chat_template)
    harmony = _harmony_factory(registry)
    if reasoning == HARMONY or (factory is not None and factory == harmony):
        # one parser for the whole stream; calls only when tools are parsed
        parser = harmony(tools=tools, parse_calls=factory is not None)
        return StreamParser(parser, None, id_factory=_ids(parser, id_factory))
    splitter = None
    if reasoning is not None:
        fmt = REASONING_FORMATS.get(reasoning)
        if fmt is None:
            raise ConfigError(
                f"unknown reasoning format {reasoning!r} (known: {', '.join(sorted(REASONING_FORMATS))}, auto, or none)"
            )
        splitter = ReasoningSplitter(fmt, starts_in_reasoning=starts_in_reasoning)
    parser = factory(tools=tools) if factory is not None else None
    return StreamParser(parser, splitter, id_factory=_ids(parser, id_factory))


def _harmony_factory(registry: Registry | None) -> Callable:
    spec = registry.tool_call_parsers.get(HARMONY) if registry is not None else None
    if spec is not None:
        return spec.factory
    from metrale_core.plugin.discovery import lazy_factory

    return lazy_factory(BUILTIN_TOOL_PARSERS[HARMONY][0])


def _ids(parser: ToolCallParser | None, id_factory: Callable[[], str]) -> Callable[[], str]:
    """The parser's own id style (``new_call_id``: Mistral's 9 characters), unless one was given."""
    own = getattr(parser, "new_call_id", None)
    return own if own is not None and id_factory is new_tool_call_id else id_factory
