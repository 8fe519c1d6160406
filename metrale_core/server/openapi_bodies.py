"""The documented 200 bodies of the server's JSON routes, as OpenAPI schemas.

Owner: :func:`metrale_core.server.openapi.documented` (a route names its body with
``ok="ChatCompletion"``, looked up in :data:`BODIES`); the schema fuzz
(``tests/server/test_server_fuzz.py``) validates every 200 body it gets against them, so a body
that drifts from its documented shape is a test failure, not a silent client break.

Invariants:
- Each schema lists the fields the route always sends as ``required``, with their types; extra
  fields are allowed (clients ignore unknown fields, and plugins may add some).
- A field the route may send as ``null`` is documented as nullable (``anyOf`` with ``null``).
- The shapes follow the APIs the routes speak: OpenAI's chat completion, completion,
  embedding list, model list and Responses object; Anthropic's message; Ollama's replies
  (``server.ollama.bodies``, on this module's helpers).
"""

from __future__ import annotations

from litestar.openapi.spec import Schema
from litestar.openapi.spec.enums import OpenAPIType

__all__ = ["BODIES", "LINKS", "STREAMS", "body_schema", "stream_schema"]


class _Optional:
    """Marks an object property that may be absent."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema


def opt(schema: Schema) -> _Optional:
    return _Optional(schema)


def obj(title: str | None = None, /, **props: Schema | _Optional) -> Schema:
    """An object whose plain properties are required and ``opt(...)`` ones optional."""
    required = [name for name, p in props.items() if not isinstance(p, _Optional)]
    return Schema(
        type=OpenAPIType.OBJECT,
        title=title,
        properties={name: p.schema if isinstance(p, _Optional) else p for name, p in props.items()},
        required=required or None,
    )


def arr(item: Schema) -> Schema:
    return Schema(type=OpenAPIType.ARRAY, items=item)


def nullable(schema: Schema) -> Schema:
    return Schema(any_of=[schema, Schema(type=OpenAPIType.NULL)])


def const(value: str) -> Schema:
    return Schema(type=OpenAPIType.STRING, enum=[value])


def enum(*values: str) -> Schema:
    return Schema(type=OpenAPIType.STRING, enum=list(values))


STR = Schema(type=OpenAPIType.STRING)
INT = Schema(type=OpenAPIType.INTEGER)
COUNT = Schema(type=OpenAPIType.INTEGER, minimum=0)
NUM = Schema(type=OpenAPIType.NUMBER)
BOOL = Schema(type=OpenAPIType.BOOLEAN)
ANY_OBJ = Schema(type=OpenAPIType.OBJECT)
NULL = Schema(type=OpenAPIType.NULL)

#: ``finish_reason`` of chat and text completions (``timeout``: ``--request-timeout`` expired).
FINISH = enum("stop", "length", "tool_calls", "timeout")
USAGE = obj("Usage", prompt_tokens=COUNT, completion_tokens=COUNT, total_tokens=COUNT)
TOOL_CALL = obj(
    "ToolCall",
    id=STR,
    type=const("function"),
    function=obj(name=STR, arguments=STR),
)

CHAT_COMPLETION = obj(
    "ChatCompletion",
    id=STR,
    object=const("chat.completion"),
    created=INT,
    model=STR,
    system_fingerprint=nullable(STR),
    choices=arr(
        obj(
            index=COUNT,
            message=obj(
                role=const("assistant"),
                content=nullable(STR),
                reasoning_content=opt(STR),
                tool_calls=opt(arr(TOOL_CALL)),
            ),
            logprobs=nullable(obj(content=arr(ANY_OBJ))),
            finish_reason=FINISH,
        )
    ),
    usage=USAGE,
)

COMPLETION = obj(
    "Completion",
    id=STR,
    object=const("text_completion"),
    created=INT,
    model=STR,
    system_fingerprint=nullable(STR),
    choices=arr(obj(index=COUNT, text=STR, logprobs=nullable(ANY_OBJ), finish_reason=FINISH)),
    usage=USAGE,
)

EMBEDDING_LIST = obj(
    "EmbeddingList",
    object=const("list"),
    data=arr(obj(object=const("embedding"), index=COUNT, embedding=Schema(any_of=[arr(NUM), STR]))),
    model=STR,
    usage=obj(prompt_tokens=COUNT, total_tokens=COUNT),
)

MODEL = obj(
    "Model",
    id=STR,
    object=const("model"),
    created=INT,
    owned_by=STR,
    max_model_len=opt(COUNT),
    parent=opt(STR),
)
MODEL_LIST = obj("ModelList", object=const("list"), data=arr(MODEL))

TOKENIZED = obj("Tokenized", tokens=arr(INT), count=COUNT, max_model_len=COUNT)
DETOKENIZED = obj("Detokenized", prompt=STR)
LORA_STATUS = obj("LoRAStatus", status=const("ok"), lora_name=STR, message=STR)
HEALTH = obj("Health", status=const("ok"), model=STR, replicas=opt(ANY_OBJ))
LIVE = obj("Liveness", status=STR)

#: One item of a Responses ``output``.
RESPONSE_ITEM = Schema(
    one_of=[
        obj(
            "OutputMessage",
            type=const("message"),
            id=STR,
            role=const("assistant"),
            status=STR,
            content=arr(obj(type=const("output_text"), text=STR, annotations=arr(ANY_OBJ))),
        ),
        obj("ReasoningItem", type=const("reasoning"), id=STR, summary=arr(ANY_OBJ)),
        obj(
            "FunctionCall",
            type=const("function_call"),
            id=STR,
            call_id=STR,
            name=STR,
            arguments=STR,
            status=STR,
        ),
    ]
)
RESPONSE = obj(
    "ResponseObject",
    id=STR,
    object=const("response"),
    created_at=NUM,
    model=STR,
    status=enum("completed", "incomplete", "in_progress", "failed", "cancelled", "queued"),
    error=nullable(ANY_OBJ),
    incomplete_details=nullable(ANY_OBJ),
    output=arr(RESPONSE_ITEM),
    parallel_tool_calls=BOOL,
    previous_response_id=nullable(STR),
    tool_choice=Schema(any_of=[STR, ANY_OBJ]),
    tools=arr(ANY_OBJ),
    usage=nullable(
        obj(
            input_tokens=COUNT,
            output_tokens=COUNT,
            total_tokens=COUNT,
            input_tokens_details=obj(cached_tokens=COUNT),
            output_tokens_details=obj(reasoning_tokens=COUNT),
        )
    ),
)
RESPONSE_DELETED = obj("ResponseDeleted", id=STR, object=const("response.deleted"), deleted=BOOL)

#: One Anthropic content block of an assistant message.
MESSAGE_BLOCK = Schema(
    one_of=[
        obj("TextBlock", type=const("text"), text=STR),
        obj("ThinkingBlock", type=const("thinking"), thinking=STR, signature=STR),
        obj("ToolUseBlock", type=const("tool_use"), id=STR, name=STR, input=ANY_OBJ),
    ]
)
MESSAGE = obj(
    "Message",
    id=STR,
    type=const("message"),
    role=const("assistant"),
    model=STR,
    content=arr(MESSAGE_BLOCK),
    stop_reason=nullable(enum("end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal")),
    stop_sequence=nullable(STR),
    usage=obj(input_tokens=COUNT, output_tokens=COUNT),
)
TOKEN_COUNT = obj("MessageTokensCount", input_tokens=COUNT)

# --- streams: the schema of one server-sent event (``data`` is a JSON text) ----------------------


def sse(payload: Schema, *, done: bool = False) -> Schema:
    """One SSE event whose ``data`` is JSON matching ``payload`` (``done``: or OpenAI's final
    ``[DONE]``)."""
    json_data = Schema(type=OpenAPIType.STRING, content_media_type="application/json", content_schema=payload)
    if done:
        json_data = Schema(
            type=OpenAPIType.STRING,
            schema_if=Schema(const="[DONE]"),
            then=Schema(),
            schema_else=Schema(content_media_type="application/json", content_schema=payload),
        )
    return obj("ServerSentEvent", data=json_data, event=opt(STR))


#: A failure after the first byte of an OpenAI-shaped stream (``{"error": {...}}``).
STREAM_ERROR = obj(
    "StreamError", error=obj(message=STR, type=STR, param=nullable(STR), code=Schema(any_of=[STR, INT, NULL]))
)
STREAM_USAGE = opt(nullable(USAGE))

CHAT_CHUNK = obj(
    "ChatCompletionChunk",
    id=STR,
    object=const("chat.completion.chunk"),
    created=INT,
    model=STR,
    system_fingerprint=nullable(STR),
    choices=arr(
        obj(
            index=COUNT,
            delta=obj(
                role=opt(const("assistant")),
                content=opt(nullable(STR)),
                reasoning_content=opt(STR),
                tool_calls=opt(
                    arr(
                        obj(
                            index=COUNT,
                            id=opt(STR),
                            type=opt(const("function")),
                            function=obj(name=opt(STR), arguments=opt(STR)),
                        )
                    )
                ),
            ),
            logprobs=nullable(obj(content=arr(ANY_OBJ))),
            finish_reason=nullable(FINISH),
        )
    ),
    usage=STREAM_USAGE,
)
COMPLETION_CHUNK = obj(
    "CompletionChunk",
    id=STR,
    object=const("text_completion"),
    created=INT,
    model=STR,
    choices=arr(obj(index=COUNT, text=STR, logprobs=nullable(ANY_OBJ), finish_reason=nullable(FINISH))),
    usage=STREAM_USAGE,
)


def _event(type_: str, **props: Schema | _Optional) -> Schema:
    return obj(type_, type=const(type_), sequence_number=opt(COUNT), **props)


_IN_ITEM = dict(item_id=STR, output_index=COUNT)
_IN_PART = dict(item_id=STR, output_index=COUNT, content_index=COUNT)
_PART = Schema(
    one_of=[
        obj(type=const("output_text"), text=STR, annotations=arr(ANY_OBJ)),
        obj(type=const("reasoning_text"), text=STR),
    ]
)
#: One event of a Responses stream (each with its ``event:`` line and ``sequence_number``).
RESPONSE_EVENT = Schema(
    one_of=[
        *(
            _event(f"response.{status}", response=RESPONSE)
            for status in ("created", "in_progress", "completed", "incomplete", "failed")
        ),
        _event("response.output_item.added", output_index=COUNT, item=RESPONSE_ITEM),
        _event("response.output_item.done", output_index=COUNT, item=RESPONSE_ITEM),
        _event("response.content_part.added", **_IN_PART, part=_PART),
        _event("response.content_part.done", **_IN_PART, part=_PART),
        _event("response.output_text.delta", **_IN_PART, delta=STR),
        _event("response.output_text.done", **_IN_PART, text=STR),
        _event("response.reasoning_text.delta", **_IN_PART, delta=STR),
        _event("response.reasoning_text.done", **_IN_PART, text=STR),
        _event("response.function_call_arguments.delta", **_IN_ITEM, delta=STR),
        _event("response.function_call_arguments.done", **_IN_ITEM, arguments=STR),
        _event("error", code=nullable(STR), message=STR, param=nullable(STR)),
    ]
)

_DELTA = Schema(
    one_of=[
        obj(type=const("text_delta"), text=STR),
        obj(type=const("thinking_delta"), thinking=STR),
        obj(type=const("signature_delta"), signature=STR),
        obj(type=const("input_json_delta"), partial_json=STR),
    ]
)
#: One event of a Messages stream (its ``event:`` line names the same type).
MESSAGE_EVENT = Schema(
    one_of=[
        obj("message_start", type=const("message_start"), message=MESSAGE),
        obj("ping", type=const("ping")),
        obj("content_block_start", type=const("content_block_start"), index=COUNT, content_block=MESSAGE_BLOCK),
        obj("content_block_delta", type=const("content_block_delta"), index=COUNT, delta=_DELTA),
        obj("content_block_stop", type=const("content_block_stop"), index=COUNT),
        obj(
            "message_delta",
            type=const("message_delta"),
            delta=obj(stop_reason=nullable(STR), stop_sequence=nullable(STR)),
            usage=obj(output_tokens=COUNT),
        ),
        obj("message_stop", type=const("message_stop")),
        obj("error", type=const("error"), error=obj(type=STR, message=STR)),
    ]
)

#: The documented bodies by name (``documented(..., ok=NAME)``).
BODIES: dict[str, Schema] = {
    "ChatCompletion": CHAT_COMPLETION,
    "Completion": COMPLETION,
    "EmbeddingList": EMBEDDING_LIST,
    "Model": MODEL,
    "ModelList": MODEL_LIST,
    "Tokenized": TOKENIZED,
    "Detokenized": DETOKENIZED,
    "LoRAStatus": LORA_STATUS,
    "Health": HEALTH,
    "Liveness": LIVE,
    "ResponseObject": RESPONSE,
    "ResponseDeleted": RESPONSE_DELETED,
    "Message": MESSAGE,
    "MessageTokensCount": TOKEN_COUNT,
}


#: The documented stream events by the name of the route's whole body.
STREAMS: dict[str, Schema] = {
    "ChatCompletion": sse(Schema(one_of=[CHAT_CHUNK, STREAM_ERROR]), done=True),
    "Completion": sse(Schema(one_of=[COMPLETION_CHUNK, STREAM_ERROR]), done=True),
    "ResponseObject": sse(RESPONSE_EVENT),
    "Message": sse(MESSAGE_EVENT),
}


_STORED_ID = "$response.body#/id"

#: OpenAPI links of a documented body by name (``Link`` keyword arguments): what a client can do
#: next with what it got.  A stored Response can be read, deleted, or continued.
LINKS: dict[str, dict[str, dict]] = {
    "ResponseObject": {
        "GetStoredResponse": {"operation_id": "getResponse", "parameters": {"response_id": _STORED_ID}},
        "DeleteStoredResponse": {"operation_id": "deleteResponse", "parameters": {"response_id": _STORED_ID}},
        "ContinueConversation": {
            "operation_id": "createResponse",
            "request_body": {"previous_response_id": _STORED_ID},
        },
    },
}


def _ollama() -> tuple[dict[str, Schema], dict[str, Schema]]:
    from metrale_core.server.ollama.bodies import OLLAMA_BODIES, OLLAMA_STREAMS  # built on this module's helpers

    return OLLAMA_BODIES, OLLAMA_STREAMS


def body_schema(name: str) -> Schema:
    """The documented body called ``name`` (a ``KeyError`` names an undocumented one)."""
    return BODIES[name] if name in BODIES else _ollama()[0][name]


def stream_schema(name: str) -> tuple[str, Schema]:
    """``(media type, schema of one event)`` of the stream of the route whose whole body is
    ``name``: a server-sent event, or one line of Ollama's NDJSON streams."""
    if name in STREAMS:
        return "text/event-stream", STREAMS[name]
    return "application/x-ndjson", _ollama()[1][name]
