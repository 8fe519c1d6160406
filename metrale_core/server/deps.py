"""What route handlers are given by Litestar's dependency injection: the host, the decoded
body, the served model's name, engine and tokenizer.

Owner: ``app.create_app`` registers :data:`DEPENDENCIES` (the host) on the app; a route with a
JSON body is declared with ``@body_post(path, ChatCompletionRequest, tag=..., ok=...)`` (Litestar's
``post`` with ``dependencies=with_body(ChatCompletionRequest)`` and the documented operation of
``openapi.body_operation``) and declares what it needs as
``NamedDependency`` parameters: ``req`` (the decoded body; ``body`` is Litestar's own name for
the raw bytes), ``model_name``, ``served``, ``engine``, ``tokenizer``, ``host``.

Invariants:
- The order of the answers is the order of the checks, as the dependency graph resolves it:
  the body first (415 / 413 / 400, decoded off the event loop by ``common.read_request``),
  then its ``model`` (404), then the served model (503 while loading or stopping); the engine
  and the tokenizer come from that one served model.
- Dependencies are resolved once per request; handlers never read ``app.state`` for them.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, post
from litestar.di import NamedDependency, Provide

from metrale_core.server.common import check_model, read_request
from metrale_core.server.decode import Body
from metrale_core.server.openapi import body_operation

__all__ = ["DEPENDENCIES", "body_post", "with_body"]


def _host(request: Request) -> Any:
    return request.app.state.host


def _model_name(host: NamedDependency[Any], req: NamedDependency[Any]) -> str:
    return check_model(host, getattr(req, "model", None))


def _served(host: NamedDependency[Any], model_name: NamedDependency[str]) -> Any:
    del model_name  # a dependency only for its order: the model is checked before readiness
    return host.ready()


def _engine(served: NamedDependency[Any]) -> Any:
    return served.engine


def _tokenizer(served: NamedDependency[Any]) -> Any:
    return served.tokenizer


#: The app's dependencies.
DEPENDENCIES = {"host": Provide(_host, sync_to_thread=False)}

#: What a body's route can be given besides the body (they depend on it: see the invariants).
_AFTER_BODY = {
    "model_name": Provide(_model_name, sync_to_thread=False),
    "served": Provide(_served, sync_to_thread=False),
    "engine": Provide(_engine, sync_to_thread=False),
    "tokenizer": Provide(_tokenizer, sync_to_thread=False),
}


def with_body(cls: type[Body]) -> dict[str, Provide]:
    """The dependencies of a route whose JSON body is a ``cls``: ``req`` and :data:`_AFTER_BODY`."""

    async def read(request: Request) -> Any:
        return await read_request(request, cls)

    return {"req": Provide(read), **_AFTER_BODY}


def body_post(
    path: str, body: type[Body], *, tag: str, ok: str, stream: bool = False, errors: str = "openai", **options: Any
) -> post:
    """Litestar's ``post`` for a route whose JSON body is a ``body``: it answers 200, is documented
    under ``tag`` with its body, its ``ok`` answer (``openapi_bodies.BODIES``; a stream too when
    ``stream``) and its error statuses in the ``errors`` API's shape, and is given ``req`` and the
    rest of :func:`with_body`. ``options`` go to ``post`` as they are (``operation_id``, ``summary``)."""
    return post(
        path,
        tags=[tag],
        status_code=200,
        operation_class=body_operation(body, stream=stream, errors=errors, ok=ok),
        dependencies=with_body(body),
        **options,
    )
