"""``POST /v1/completions``: the legacy OpenAI completions API, streamed or whole.

Owner: the server.

Invariants:
- ``prompt`` is a string (encoded with the tokenizer's special tokens, e.g. BOS), token ids, or
  a batch of either; choice ``k`` of prompt ``p`` has index ``p * n + k``.
- ``echo`` prepends the prompt text; ``suffix`` and ``best_of`` other than ``n`` are refused
  with a 400 (not silently ignored).
- Usage: prompt tokens of every prompt once, completion tokens summed over all choices.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

from litestar import Request, Response
from litestar.di import NamedDependency

from metrale_core.server.chat import engine_failure
from metrale_core.server.common import new_id, usage, while_connected
from metrale_core.server.deps import body_post
from metrale_core.server.errors import APIError
from metrale_core.server.generation import plan_completion
from metrale_core.server.guards import check_prompt_chars
from metrale_core.server.logprobs import TokenNamer, completion_logprobs
from metrale_core.server.offload import off_loop
from metrale_core.server.schemas import CompletionRequest
from metrale_core.server.streaming import sse_response

__all__ = ["completions"]


def _prompts(tokenizer: Any, prompt: Any, max_model_len: int) -> list[list[int]]:
    """Token ids of every prompt (run off the event loop); 400 for a text that cannot fit."""
    texts = [prompt] if isinstance(prompt, str) else [p for p in prompt if isinstance(p, str)]
    for text in texts:
        check_prompt_chars(len(text), tokenizer, max_model_len, "prompt")
    if isinstance(prompt, str):
        return [tokenizer.encode(prompt, add_special_tokens=True)]
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    return [tokenizer.encode(p, add_special_tokens=True) if isinstance(p, str) else list(p) for p in prompt]


@body_post(
    "/v1/completions",
    CompletionRequest,
    tag="openai",
    ok="Completion",
    stream=True,
    operation_id="createCompletion",
    summary="Create a completion (legacy OpenAI API)",
)
async def completions(
    request: Request,
    host: NamedDependency[Any],
    req: NamedDependency[CompletionRequest],
    model_name: NamedDependency[str],
    engine: NamedDependency[Any],
    tokenizer: NamedDependency[Any],
) -> Response:
    if req.suffix:
        raise APIError(400, "suffix: not supported by this server", param="suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise APIError(400, "best_of: only best_of == n is supported", param="best_of")
    if req.echo and req.logprobs is not None:
        raise APIError(400, "echo with logprobs is not supported (no prompt logprobs)", param="echo")
    prompts = await off_loop(_prompts, tokenizer, req.prompt, engine.max_model_len)
    planned = await plan_completion(host, req, prompts)
    namer = TokenNamer(tokenizer) if req.logprobs is not None else None
    echo = {index: tokenizer.decode(ids) if req.echo else "" for index, ids in planned.prompts.items()}
    meta = {"id": new_id("cmpl"), "object": "text_completion", "created": int(time.time()), "model": model_name}
    prompt_tokens = sum(len(p) for p in prompts)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return sse_response(_stream(planned.stream, namer, echo, meta, prompt_tokens, include_usage))
    texts = {index: [echo[index]] for index in planned.prompts}
    lps: dict[int, list] = {index: [] for index in planned.prompts}
    finals: dict[int, Any] = {}

    async def collect() -> None:
        async with aclosing(planned.stream) as stream:
            async for index, out in stream:
                texts[index].append(out.text_delta)
                if out.logprobs:
                    lps[index] += out.logprobs
                if out.finished:
                    if (failure := engine_failure(out)) is not None:
                        raise failure
                    finals[index] = out

    await while_connected(request, collect())
    choices = [
        {
            "index": i,
            "text": "".join(texts[i]),
            "logprobs": completion_logprobs(namer, lps[i], len(echo[i])) if namer else None,
            "finish_reason": finals[i].finish_reason,
        }
        for i in sorted(finals)
    ]
    body = {
        **meta,
        "system_fingerprint": None,
        "choices": choices,
        "usage": usage(prompt_tokens, sum(o.num_output_tokens for o in finals.values())),
    }
    return Response(body, media_type="application/json")


async def _stream(
    outputs: AsyncGenerator[tuple[int, Any], None],
    namer: TokenNamer | None,
    echo: dict[int, str],
    meta: dict,
    prompt_tokens: int,
    include_usage: bool,
) -> AsyncIterator[dict]:
    extra = {"usage": None} if include_usage else {}
    offsets = {index: len(text) for index, text in echo.items()}
    generated = 0

    def chunk(index: int, text: str, logprobs: Any, finish: str | None) -> dict:
        return {
            **meta,
            "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}],
            **extra,
        }

    for index, text in echo.items():
        if text:
            yield chunk(index, text, None, None)
    async with aclosing(outputs) as stream:
        async for index, out in stream:
            lp = None
            if namer is not None and out.logprobs:
                lp = completion_logprobs(namer, out.logprobs, offsets[index])
            offsets[index] += len(out.text_delta)
            if out.finished:
                if (failure := engine_failure(out)) is not None:
                    raise failure
                generated += out.num_output_tokens
                yield chunk(index, out.text_delta, lp, out.finish_reason)
            elif out.text_delta or lp:
                yield chunk(index, out.text_delta, lp, None)
    if include_usage:
        yield {**meta, "choices": [], "usage": usage(prompt_tokens, generated)}
