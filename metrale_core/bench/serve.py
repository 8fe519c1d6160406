"""``met bench serve``'s load generator: closed-loop streams at each concurrency level, timed.

Owner: ``metrale_core.cli.bench_cmd``.  Talks to any OpenAI-compatible server (``met serve``,
llama-server, vLLM) over HTTP: ``GET /v1/models`` (the model, and whether the server is up at
all), ``POST /tokenize`` for exact prompt lengths (:mod:`metrale_core.bench.prompts`), then per
level ``--num-prompts`` streamed requests with ``ignore_eos``, ``max_tokens`` and
``stream_options.include_usage``, at most ``concurrency`` in flight (a new one starts as one
ends, like ``vllm bench serve --max-concurrency`` at an infinite request rate).  The streams go
through the lean :class:`~metrale_core.bench.sse_client.SSEClient`, whose CPU cost per token is
small next to the server's on a shared machine.

Invariants:
- A failed request (error status, error event, dropped connection, ``--request-timeout``) is
  recorded with its error and counted; it never stops the run.  A server that does not answer
  ``/v1/models`` is one :class:`BenchError` line before any request.
- Each level has its own prompts (no prefix cache carries over between levels); the warm-up
  requests are never counted.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

from metrale_core.bench.prompts import Prompt, make_prompts
from metrale_core.bench.sse_client import SSEClient
from metrale_core.bench.stats import RequestRecord, level_figures
from metrale_core.errors import MetraleError

__all__ = ["BenchError", "ServeBenchConfig", "run_serve_bench"]


class BenchError(MetraleError):
    """The benchmark cannot run (server unreachable, no model, bad options)."""


@dataclass
class ServeBenchConfig:
    url: str
    concurrency: list[int]
    prompt_tokens: int = 500
    output_tokens: int = 128
    #: Requests per level (None: ``max(4, 2 * concurrency)``).
    num_prompts: int | None = None
    model: str | None = None
    endpoint: str = "completions"
    api_key: str | None = None
    seed: int = 0
    #: Untimed requests before the first level (None: the highest concurrency, so every
    #: connection is open before timing starts).
    warmup: int | None = None
    request_timeout: float = 600.0
    progress: bool = True

    def prompts_for(self, concurrency: int) -> int:
        return self.num_prompts if self.num_prompts else max(4, 2 * concurrency)


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def probe_server(http: Any, base: str) -> dict[str, Any]:
    """``/v1/models`` (required) and what the server says of its version (``/version``, vLLM;
    ``/props``' ``build_info``, llama.cpp); a server that is not up is a :class:`BenchError`."""
    import httpx

    try:
        r = await http.get(base + "/v1/models")
    except httpx.HTTPError as exc:
        raise BenchError(f"cannot reach {base}/v1/models ({type(exc).__name__}: {exc}); is the server up?") from None
    if r.status_code in (401, 403):
        raise BenchError(f"{base}/v1/models answered {r.status_code}: pass the server's key with --api-key")
    if r.status_code != 200:
        raise BenchError(f"{base}/v1/models answered HTTP {r.status_code}: {r.text[:200]}")
    models = r.json().get("data") or []
    info: dict[str, Any] = {"models": models, "server_header": r.headers.get("server")}
    for path, key in (("/version", "version"), ("/props", "build_info")):
        try:
            v = await http.get(base + path)
        except httpx.HTTPError:
            continue
        if v.status_code == 200 and "json" in v.headers.get("content-type", ""):
            value = v.json().get(key)
            if value:
                info["version"] = str(value)
                break
    return info


def _body(config: ServeBenchConfig, model: str, prompt: Prompt, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if config.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt.text}]
    else:
        body["prompt"] = prompt.ids if prompt.ids is not None else prompt.text
    return body


class _Runner:
    """One benchmark's connections and request loop."""

    def __init__(self, config: ServeBenchConfig, model: str) -> None:
        parts = urlsplit(config.url)
        if parts.scheme != "http" or not parts.hostname:
            raise BenchError(f"--url must be http://HOST[:PORT] (got {config.url!r}; https is not supported)")
        self.config, self.model = config, model
        self.path = "/v1/chat/completions" if config.endpoint == "chat" else "/v1/completions"
        self.sse = SSEClient(parts.hostname, parts.port or 80, _headers(config.api_key))

    async def one(self, prompt: Prompt, max_tokens: int) -> RequestRecord:
        body = _body(self.config, self.model, prompt, max_tokens)
        sent = time.perf_counter()
        try:
            timing = await asyncio.wait_for(self.sse.stream(self.path, body), self.config.request_timeout)
        except asyncio.TimeoutError:
            return RequestRecord(sent, done=time.perf_counter(), error=f"timeout after {self.config.request_timeout} s")
        except (OSError, RuntimeError, ValueError) as exc:  # StreamFailed, refused/reset connections
            return RequestRecord(sent, done=time.perf_counter(), error=f"{type(exc).__name__}: {exc}"[:300])
        record = RequestRecord.from_usage(timing.sent, timing.event_times, timing.done, timing.usage)
        if record.prompt_tokens is None:
            record.prompt_tokens = prompt.tokens
        return record

    async def level(self, prompts: list[Prompt], concurrency: int, bar: Any = None) -> list[RequestRecord]:
        """Every prompt once, at most ``concurrency`` in flight; records in prompt order."""
        records: list[RequestRecord | None] = [None] * len(prompts)
        pending = iter(range(len(prompts)))

        async def worker() -> None:
            for i in pending:
                records[i] = await self.one(prompts[i], self.config.output_tokens)
                if bar is not None:
                    bar.update(1)

        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(prompts)))))
        return [r for r in records if r is not None]

    async def warm_up(self, prompts: list[Prompt], concurrency: int) -> None:
        pending = iter(prompts)

        async def worker() -> None:
            for prompt in pending:
                await self.one(prompt, min(4, self.config.output_tokens))

        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(prompts)))))


def _progress(total: int, desc: str, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="req", file=sys.stderr, disable=None if enabled else True, leave=True)


async def _run(config: ServeBenchConfig) -> dict[str, Any]:
    import httpx

    base = config.url.rstrip("/")
    config.url = base
    async with httpx.AsyncClient(timeout=60, headers=_headers(config.api_key)) as http:
        server = await probe_server(http, base)
        model = config.model or (server["models"][0]["id"] if server["models"] else None)
        if not model:
            raise BenchError(f"{base}/v1/models lists no model: pass --model")
        entry = next((m for m in server["models"] if m.get("id") == model), None)
        as_ids = config.endpoint == "completions"
        prompt_sets = [
            await make_prompts(http, base, config.prompts_for(c), config.prompt_tokens, config.seed + 1000 * i, as_ids)
            for i, c in enumerate(config.concurrency)
        ]
        warm_count = max(config.concurrency) if config.warmup is None else config.warmup
        warm_set = (
            await make_prompts(http, base, warm_count, min(config.prompt_tokens, 32), config.seed - 1, as_ids)
            if warm_count
            else None
        )
    runner = _Runner(config, model)
    levels = []
    try:
        if warm_set is not None:
            await runner.warm_up(warm_set.prompts, max(config.concurrency))
        for concurrency, prompt_set in zip(config.concurrency, prompt_sets):
            with _progress(len(prompt_set.prompts), f"concurrency {concurrency}", config.progress) as bar:
                records = await runner.level(prompt_set.prompts, concurrency, bar)
            levels.append({"concurrency": concurrency, **level_figures(records)})
    finally:
        runner.sse.close()
    return {
        "config": {**asdict(config), "api_key": "***" if config.api_key else None, "model": model},
        "server": {"model_entry": entry, "version": server.get("version"), "server_header": server["server_header"]},
        "prompts": {
            "tokens": config.prompt_tokens,
            "exact": all(s.exact for s in prompt_sets),
            "how": prompt_sets[0].how if prompt_sets else "",
        },
        "levels": levels,
    }


def run_serve_bench(config: ServeBenchConfig) -> dict[str, Any]:
    """Run every level of ``config``; the result (config, server, prompts, levels) as a dict."""
    if not config.concurrency or min(config.concurrency) < 1:
        raise BenchError("--concurrency needs positive integers, e.g. 1,16")
    if config.endpoint not in ("completions", "chat"):
        raise BenchError(f"--endpoint must be completions or chat (got {config.endpoint!r})")
    return asyncio.run(_run(config))
