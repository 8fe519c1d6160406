"""The documented 200 bodies of the Ollama routes, as OpenAPI schemas.

Owner: ``server.openapi_bodies.body_schema`` / ``stream_schema`` look names up here after their
own tables (``documented(..., ok="OllamaChat")``); the schema fuzz validates every 200 body (and
every NDJSON line of a stream) against them.

Invariants: the fields each route always sends are ``required``; ``created_at`` is RFC 3339; the
durations are nanoseconds (``COUNT``); a stream line is a delta, the final line, or an error.
"""

from __future__ import annotations

from litestar.openapi.spec import Schema

from metrale_core.server.openapi_bodies import ANY_OBJ, COUNT, NUM, STR, arr, const, enum, obj, opt

__all__ = ["OLLAMA_BODIES", "OLLAMA_STREAMS"]

_TOOL_CALL = obj(function=obj(name=STR, arguments=ANY_OBJ, index=opt(COUNT)))
_MESSAGE = obj(role=const("assistant"), content=STR, thinking=opt(STR), tool_calls=opt(arr(_TOOL_CALL)))
_FINAL = dict(
    done_reason=enum("stop", "length", "load"),
    total_duration=opt(COUNT),
    load_duration=opt(COUNT),
    prompt_eval_count=opt(COUNT),
    prompt_eval_duration=opt(COUNT),
    eval_count=opt(COUNT),
    eval_duration=opt(COUNT),
)


def _line(title: str, done: bool, **content: Schema) -> Schema:
    extra = _FINAL if done else {}
    return obj(title, model=STR, created_at=STR, done=Schema(const=done), **content, **extra)  # type: ignore[arg-type]


_CHAT_FINAL = _line("OllamaChat", True, message=_MESSAGE)
_GENERATE_CONTENT = dict(response=STR, thinking=opt(STR))
_GENERATE_FINAL = _line("OllamaGenerate", True, **_GENERATE_CONTENT)  # type: ignore[arg-type]
_ERROR_LINE = obj("OllamaStreamError", error=STR)

_DETAILS = obj(parent_model=STR, format=STR, family=STR, families=arr(STR), parameter_size=STR, quantization_level=STR)
_TAG = obj(name=STR, model=STR, modified_at=STR, size=COUNT, digest=STR, details=_DETAILS)

OLLAMA_BODIES: dict[str, Schema] = {
    "OllamaChat": _CHAT_FINAL,
    "OllamaGenerate": _GENERATE_FINAL,
    "OllamaTags": obj("OllamaTags", models=arr(_TAG)),
    "OllamaPs": obj(
        "OllamaPs",
        models=arr(obj(name=STR, model=STR, size=COUNT, digest=STR, details=_DETAILS, expires_at=STR, size_vram=COUNT)),
    ),
    "OllamaVersion": obj("OllamaVersion", version=STR),
    "OllamaShow": obj(
        "OllamaShow",
        modified_at=STR,
        template=STR,
        details=_DETAILS,
        model_info=ANY_OBJ,
        capabilities=arr(enum("completion", "tools", "thinking", "embedding")),
    ),
    "OllamaEmbed": obj("OllamaEmbed", model=STR, embeddings=arr(arr(NUM)), prompt_eval_count=opt(COUNT)),
    "OllamaEmbeddings": obj("OllamaEmbeddings", embedding=arr(NUM)),
    "OllamaStatus": obj("OllamaStatus", status=STR),
}

#: One line of each streaming route's NDJSON stream.
OLLAMA_STREAMS: dict[str, Schema] = {
    "OllamaChat": Schema(one_of=[_line("OllamaChatDelta", False, message=_MESSAGE), _CHAT_FINAL, _ERROR_LINE]),
    "OllamaGenerate": Schema(
        one_of=[_line("OllamaGenerateDelta", False, **_GENERATE_CONTENT), _GENERATE_FINAL, _ERROR_LINE]  # type: ignore[arg-type]
    ),
}
