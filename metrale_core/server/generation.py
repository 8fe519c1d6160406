"""From a validated request to engine requests and back: sampling params, choices, merging.

Owner: the chat path (``translate.start_chat``), the completions and embeddings routes.
:func:`plan_jobs` turns one API request into one :class:`Job` per choice (``n`` per prompt)
after every check that can fail, and hands the route a :class:`Planned`: the choices and the
stream (:func:`run_jobs`) of their deltas, merged, as ``(choice index, RequestOutput)`` pairs.
The sampling parameters only go down from here (to the engine's check, then into the stream):
a route never gets them back.

Invariants:
- Everything that can reject a request (prompt too long, ``max_tokens`` beyond the context,
  token ids or ``logit_bias`` keys outside the vocabulary, a full queue) raises before the first
  engine request is added, so a rejected request is always a clean 4xx/503 and never a
  half-started stream.
- Each job is checked by the engine exactly once, under its real request id
  (:func:`checked` -> ``LLMEngine.validate_request``), and carries the engine's typed
  ``EngineRequest``, which the engine (its thread, or a data-parallel replica) queues as it is.
- :func:`plan_jobs` admits the request (``EngineHost.admit``) as its last step: from then on it
  counts against the queue limit, for streams too, until :func:`run_jobs` ends (or the
  returned :class:`Planned` is dropped unrun).
- ``n`` choices are ``n`` engine requests; with a ``seed``, choice ``i`` uses ``seed + i``
  (so ``n=2`` does not return two identical samples and a fixed seed is reproducible).
- When the consumer stops (client gone, error, shutdown), every engine request still running is
  aborted at once (``AsyncEngine.generate``'s ``aclose`` aborts), freeing its KV blocks.
- Per-request timings feed the metrics: time to first token, inter-token latency, end to end.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import AsyncGenerator, Iterator, Sequence
from contextlib import aclosing, contextmanager
from typing import Any

from attrs import define, frozen

from metrale_core.engine.pooling import Pooling
from metrale_core.engine.request import EngineRequest
from metrale_core.errors import RequestError
from metrale_core.sampling.params import SamplingParams
from metrale_core.server.common import adapter_extras
from metrale_core.server.errors import APIError
from metrale_core.server.guards import check_bias_vocab
from metrale_core.server.offload import off_loop
from metrale_core.server.structured import structured_output

__all__ = [
    "Job",
    "Jobs",
    "Planned",
    "checked",
    "new_request_ids",
    "plan_completion",
    "plan_embeddings",
    "plan_jobs",
    "planned",
    "run_jobs",
    "sampling_params",
    "stop_lists",
]


@frozen
class Job:
    """One engine request: one choice of one prompt, as the engine checked it."""

    index: int
    #: The engine's checked record (``LLMEngine.validate_request``): id, prompt ids, sampling
    #: params, extras (e.g. ``{"stream_parser": ...}``).  The engine queues it as it is.
    request: EngineRequest

    @property
    def prompt_ids(self) -> tuple[int, ...]:
        return self.request.prompt_ids

    @property
    def extras(self) -> dict | None:
        """Per-sequence plugin state handed to the engine, or None."""
        return self.request.extras


class Jobs(list):
    """The jobs of one request plus its ``admission`` (released by :func:`run_jobs`)."""

    admission: Any = None


@define
class Planned:
    """A planned API request as its route sees it: its choices and the stream of their deltas.

    The engine records (sampling parameters included) went on down into ``stream``: a route
    never handles them, it reads outputs."""

    #: Choice index -> the prompt ids it continues, in choice order.
    prompts: dict[int, tuple[int, ...]]
    #: The choices carry plugin extras (a stream parser): their output comes parsed.
    parsed: bool
    #: The merged deltas as ``(choice index, RequestOutput)`` (:func:`run_jobs`): iterating it
    #: runs the engine requests (and releases the admission at the end); closing it aborts
    #: those still running.
    stream: AsyncGenerator[tuple[int, Any], None]


def planned(host: Any, jobs: Sequence[Job]) -> Planned:
    """The route's view of ``jobs`` (their stream not started)."""
    parsed = bool(jobs) and jobs[0].extras is not None
    return Planned({job.index: job.prompt_ids for job in jobs}, parsed, run_jobs(host, jobs))


def stop_lists(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def sampling_params(
    req: Any,
    *,
    max_tokens: int,
    logprobs: int | None,
    seed_offset: int = 0,
    structured: Any = None,
    reasoning_budget: Any = None,
) -> SamplingParams:
    """The engine's ``SamplingParams`` for one choice of ``req`` (chat or completion request)."""
    seed = None if req.seed is None else (req.seed + seed_offset) & ((1 << 64) - 1)
    top_k = req.top_k if req.top_k is not None and req.top_k > 0 else 0
    bias = {int(k): v for k, v in (req.logit_bias or {}).items()}
    try:
        return SamplingParams(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=top_k,
            min_p=req.min_p or 0.0,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            repetition_penalty=req.repetition_penalty or 1.0,
            logit_bias=bias,
            seed=seed,
            max_tokens=max_tokens,
            stop=stop_lists(req.stop),
            stop_token_ids=tuple(req.stop_token_ids or ()),
            ignore_eos=req.ignore_eos,
            logprobs=logprobs,
            structured=structured,
            reasoning_budget=reasoning_budget,
        )
    except (TypeError, ValueError) as exc:
        raise APIError(400, f"bad sampling parameter: {exc}") from None


def _max_tokens(requested: int | None, prompt_len: int, max_model_len: int) -> int:
    room = max_model_len - prompt_len
    if room < 1:
        raise APIError(
            400,
            f"the prompt has {prompt_len} tokens, which leaves no room for output "
            f"in this model's context of {max_model_len} tokens; shorten it",
            param="messages",
            code="context_length_exceeded",
        )
    if requested is None:
        return room
    if requested > room:
        raise APIError(
            400,
            f"this model's maximum context length is {max_model_len} tokens; "
            f"the prompt has {prompt_len} tokens and max_tokens is {requested} "
            f"({prompt_len + requested} in all); lower max_tokens or shorten the "
            f"prompt",
            param="max_tokens",
            code="context_length_exceeded",
        )
    return requested


async def plan_jobs(
    host: Any,
    req: Any,
    prompts: Sequence[list[int]],
    *,
    max_tokens: int | None,
    logprobs: int | None,
    extras_factory=None,
    structured: Any = None,
    reasoning_budget: Any = None,
) -> Planned:
    """One job per (prompt, choice), each checked by the engine once, as the route's
    :class:`Planned`; raises 4xx / 503.

    ``structured``: the request's ``StructuredOutput`` (``server.structured``), or None;
    ``reasoning_budget``: its ``ReasoningBudget`` (``server.thinking_budget``), or None.  A
    constrained request is validated on a frontend worker thread: compiling its grammar (and, for
    the first one, the structured-output plugin's tokenizer index) is CPU work the event loop
    must not do."""
    engine = host.ready().engine
    host.check_capacity(len(prompts) * req.n)
    check_bias_vocab(getattr(req, "logit_bias", None), engine.model.info.vocab_size)
    adapter = adapter_extras(host, getattr(req, "model", None))
    args = (engine, req, prompts, max_tokens, logprobs, extras_factory, structured, reasoning_budget, adapter)
    jobs = await off_loop(_validated_jobs, *args) if structured is not None else _validated_jobs(*args)
    jobs.admission = host.admit(len(jobs))
    return planned(host, jobs)


async def plan_completion(host: Any, req: Any, prompts: Sequence[list[int]]) -> Planned:
    """:func:`plan_jobs` for a ``CompletionRequest``: its ``max_tokens`` (16 when not given),
    ``logprobs`` and structured-output fields."""
    return await plan_jobs(
        host,
        req,
        prompts,
        max_tokens=req.max_tokens if req.max_tokens is not None else 16,
        logprobs=req.logprobs,
        structured=structured_output(req),
    )


def plan_embeddings(host: Any, prompts: Sequence[list[int]], mode: str) -> Planned:
    """One prefill-only pooling job per input (``extras={"pooling": Pooling(mode)}``), each
    checked by the engine once; an input it refuses is a 400 naming ``input[i]``."""
    engine = host.ready().engine
    params = SamplingParams(temperature=0.0, max_tokens=1)
    ids = new_request_ids()
    jobs = []
    for i, prompt in enumerate(prompts):
        where = f"input[{i}]"
        request = checked(
            engine, next(ids), prompt, params, {"pooling": Pooling(mode)}, param=where, prefix=f"{where}: "
        )
        jobs.append(Job(index=i, request=request))
    return planned(host, jobs)


def new_request_ids() -> Iterator[str]:
    """Fresh engine request ids for the jobs of one API request: ``<base>-0``, ``<base>-1``, ..."""
    base = uuid.uuid4().hex[:16]
    return (f"{base}-{n}" for n in itertools.count())


def checked(
    engine: Any,
    request_id: str,
    prompt: Sequence[int],
    params: SamplingParams,
    extras: dict | None,
    *,
    param: str,
    prefix: str = "",
) -> EngineRequest:
    """``engine.validate_request`` (the request's one check, under its real id), with a refusal
    as a 400 naming ``param`` (or the field a logit processor named), its message after
    ``prefix``."""
    try:
        return engine.validate_request(request_id, prompt, params, extras=extras)
    except RequestError as exc:
        message = prefix + str(exc).replace(f"request {request_id!r}: ", "")
        raise APIError(400, message, param=getattr(exc, "param", None) or param) from None


def _validated_jobs(
    engine, req, prompts, max_tokens, logprobs, extras_factory, structured, reasoning_budget, adapter
) -> Jobs:
    jobs = Jobs()
    ids = new_request_ids()
    for p, prompt in enumerate(prompts):
        limit = _max_tokens(max_tokens, len(prompt), engine.max_model_len)
        for i in range(req.n):
            params = sampling_params(
                req,
                max_tokens=limit,
                logprobs=logprobs,
                seed_offset=i,
                structured=structured,
                reasoning_budget=reasoning_budget,
            )
            extras = extras_factory() if extras_factory is not None else None
            if adapter:
                extras = {**(extras or {}), **adapter}
            request = checked(engine, next(ids), prompt, params, extras, param="prompt")
            jobs.append(Job(index=p * req.n + i, request=request))
    return jobs


async def _timed(host: Any, job: Job) -> AsyncGenerator[Any, None]:
    """The engine stream of one job, observed for the latency and token metrics.

    A stream the consumer abandons (client gone) is recorded as finished with ``"abort"`` and
    the tokens generated so far.
    """
    metrics = host.metrics
    start = last = time.perf_counter()
    first, final = True, None
    latest = None
    request_id = job.request.request_id
    host.running_ids.add(request_id)
    try:
        async with aclosing(host.async_engine.generate(job.request)) as stream:
            async for out in stream:
                now = time.perf_counter()
                latest = out
                if out.new_token_ids:
                    # one inter-token observation per engine step, also when a consumer behind got
                    # several steps coalesced: the time since the last delivery shared between them
                    # (the steps after the first token of the first delivery came with it: 0)
                    if first:
                        metrics.ttft.observe(now - start)
                        first = False
                        gaps = [0.0] * (out.steps - 1)
                    else:
                        gaps = [(now - last) / out.steps] * out.steps
                    for gap in gaps:
                        metrics.itl.observe(gap)
                    last = now
                if out.finished:
                    final = out
                yield out
    finally:
        host.running_ids.discard(request_id)
        end = time.perf_counter() - start
        if final is not None:
            metrics.finished(final.finish_reason, final.num_prompt_tokens, final.num_output_tokens, end)
        else:
            metrics.finished("abort", len(job.prompt_ids), latest.num_output_tokens if latest is not None else 0, end)


@contextmanager
def _released(admission: Any) -> Iterator[None]:
    try:
        yield
    finally:
        admission.release()


async def run_jobs(host: Any, jobs: Sequence[Job]) -> AsyncGenerator[tuple[int, Any], None]:
    """Merged deltas of ``jobs`` as ``(job.index, RequestOutput)``; aborts the rest on exit."""
    admission = getattr(jobs, "admission", None)
    with host.admitted(len(jobs)) if admission is None else _released(admission):
        if len(jobs) == 1:
            async with aclosing(_timed(host, jobs[0])) as stream:
                async for out in stream:
                    yield jobs[0].index, out
            return
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(job: Job) -> None:
            try:
                async with aclosing(_timed(host, job)) as stream:
                    async for out in stream:
                        queue.put_nowait((job.index, out))
            except Exception as exc:
                queue.put_nowait((job.index, exc))

        tasks = [asyncio.create_task(pump(job)) for job in jobs]
        try:
            remaining = len(jobs)
            while remaining:
                index, item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                if item.finished:
                    remaining -= 1
                yield index, item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
