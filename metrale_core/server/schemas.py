"""Request records of the OpenAI-compatible API (chat, completions, embeddings, tokenize).

Owner: the server routes decode bodies into these with :func:`~metrale_core.server.decode.parse_body`
(one msgspec decode validates them); everything after that works on these frozen records.

Invariants:
- A field OpenAI does not document (nor the vLLM extensions listed here) is a 400 naming its
  path (``messages[0].foo: unknown field``); documented fields are all accepted.
- A string field with a fixed set of values lists them for the OpenAPI document (``enum``); the
  routes check them, with messages naming the field.
- Numeric fields carry their bound from ``ranges.BOUNDS`` (checked by ``ranges.check_ranges``,
  shown in the document); a union's ``Meta`` description is what its 400 says it must be.
"""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta

from metrale_core.server.decode import Body, Record, parse_body
from metrale_core.server.errors import APIError
from metrale_core.server.ranges import bounded, check_ranges

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "ContentPart",
    "DetokenizeRequest",
    "EmbeddingRequest",
    "FunctionDef",
    "NamedToolChoice",
    "Prompt",
    "ResponseFormat",
    "StreamOptions",
    "TokenizeRequest",
    "Tool",
    "ToolCall",
    "check_prompt",
    "check_ranges",
    "one_of",
    "parse_body",
]

ROLES = ("system", "developer", "user", "assistant", "tool")


def one_of(*values: str) -> Meta:
    """The ``Annotated`` metadata of a string field whose allowed values the OpenAPI document
    lists (``enum``); the routes check them, with messages naming the field."""
    return Meta(extra_json_schema={"enum": list(values)})


# --- leaf records ----------------------------------------------------------------------------


class ContentPart(Record, frozen=True):
    """One part of a message's content; only ``text`` parts can be served."""

    type: Annotated[str, one_of("text", "refusal", "image_url", "input_audio", "file")]
    text: str | None = None
    image_url: dict[str, Any] | None = None
    input_audio: dict[str, Any] | None = None
    file: dict[str, Any] | None = None
    refusal: str | None = None


class FunctionCall(Record, frozen=True):
    name: str
    arguments: str


class ToolCall(Record, frozen=True):
    """A tool call in an assistant message of the conversation history."""

    id: str
    function: FunctionCall
    type: Annotated[str, one_of("function")] = "function"
    index: int | None = None


Content = Annotated[str | list[ContentPart] | None, Meta(description="a string or an array of content parts")]


class ChatMessage(Record, frozen=True):
    role: Annotated[str, one_of(*ROLES)]
    content: Content = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    #: Earlier reasoning of an assistant turn (passed to the template; vLLM extension).
    reasoning_content: str | None = None
    refusal: str | None = None
    function_call: dict[str, Any] | None = None
    audio: dict[str, Any] | None = None


class FunctionDef(Record, frozen=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Record, frozen=True):
    type: Annotated[str, one_of("function")]
    function: FunctionDef


class NamedFunction(Record, frozen=True):
    name: str


class NamedToolChoice(Record, frozen=True):
    type: Annotated[str, one_of("function")]
    function: NamedFunction


ToolChoice = Annotated[
    str | NamedToolChoice | None,
    Meta(description='\'none\', \'auto\', \'required\' or {"type": "function", "function": {"name": ...}}'),
]


class StreamOptions(Record, frozen=True):
    include_usage: bool = False
    include_obfuscation: bool | None = None
    #: vLLM extension: a usage object on every chunk.
    continuous_usage_stats: bool = False


class ResponseFormat(Record, frozen=True):
    type: str
    json_schema: dict[str, Any] | None = None
    #: llama.cpp: ``{"type": "json_object", "schema": {...}}``.
    schema: dict[str, Any] | None = None


Stop = Annotated[str | list[str] | None, Meta(description="a string or an array of strings")]
_PROMPT_WHAT = "a string, an array of token ids, or an array of either"
#: A string, token ids, or a batch of either (one kind of item: checked by :func:`check_prompt`).
Prompt = Annotated[str | list[int | str | list[int]], Meta(description=_PROMPT_WHAT)]


def check_prompt(prompt: Any, param: str) -> None:
    """400 unless ``prompt`` is a string, or a non-empty array whose items are all token ids, all
    strings, or all non-empty arrays of token ids."""
    if isinstance(prompt, str):
        return
    if not prompt:
        raise APIError(400, f"{param}: must be {_PROMPT_WHAT} (non-empty), got an empty array", param=param)
    kinds = {type(item) for item in prompt}
    if len(kinds) > 1 or (kinds == {list} and not all(prompt)):
        raise APIError(400, f"{param}: must be {_PROMPT_WHAT}; mixed or empty items are not accepted", param=param)


# --- requests --------------------------------------------------------------------------------


class _SamplingRequest(Body, frozen=True):
    """Fields chat and completions share (OpenAI's, then vLLM's extensions)."""

    model: str | None = None
    frequency_penalty: Annotated[float, bounded("frequency_penalty")] = 0.0
    presence_penalty: Annotated[float, bounded("presence_penalty")] = 0.0
    logit_bias: dict[str, float] | None = None
    max_tokens: Annotated[int, bounded("max_tokens")] | None = None
    n: Annotated[int, bounded("n")] = 1
    seed: Annotated[int, bounded("seed")] | None = None
    stop: Stop = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: Annotated[float, bounded("temperature")] | None = None
    top_p: Annotated[float, bounded("top_p")] | None = None
    user: str | None = None
    # vLLM extensions
    top_k: Annotated[int, bounded("top_k")] | None = None
    min_p: Annotated[float, bounded("min_p")] | None = None
    repetition_penalty: Annotated[float, bounded("repetition_penalty")] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    #: Structured output (``metrale_core.server.structured``): vLLM's object, llama.cpp's fields.
    structured_outputs: dict[str, Any] | None = None
    json_schema: dict[str, Any] | None = None
    grammar: str | None = None


class ChatCompletionRequest(_SamplingRequest, kw_only=True, frozen=True):
    messages: list[ChatMessage]
    logprobs: bool = False
    top_logprobs: Annotated[int, bounded("top_logprobs")] | None = None
    max_completion_tokens: Annotated[int, bounded("max_completion_tokens")] | None = None
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice = None
    parallel_tool_calls: bool | None = None
    # documented OpenAI fields that change nothing here
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    # documented OpenAI fields this server cannot honour (a non-empty value is a 400)
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: Annotated[str | dict[str, Any] | None, Meta(description="a string or an object")] = None
    # vLLM extensions
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    #: At most this many reasoning tokens, then ``</think>`` is forced (``server.thinking_budget``).
    thinking_token_budget: Annotated[int, bounded("thinking_token_budget")] | None = None


class CompletionRequest(_SamplingRequest, kw_only=True, frozen=True):
    prompt: Prompt
    logprobs: Annotated[int, bounded("logprobs")] | None = None
    echo: bool = False
    best_of: Annotated[int, bounded("best_of")] | None = None
    suffix: str | None = None
    response_format: ResponseFormat | None = None

    def __post_init__(self) -> None:
        check_prompt(self.prompt, "prompt")


class TokenizeRequest(Body, frozen=True):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(Body, frozen=True):
    tokens: list[int]
    model: str | None = None


class EmbeddingRequest(Body, frozen=True):
    """``POST /v1/embeddings``."""

    input: Prompt
    model: str | None = None
    encoding_format: str = "float"
    dimensions: int | None = None
    user: str | None = None

    def __post_init__(self) -> None:
        check_prompt(self.input, "input")
