"""Benchmark: the HTTP server against the in-process ``AsyncEngine`` on the same workload.

For 1, 4 and 16 concurrent streams, each stream a completion of ``--max-tokens`` tokens
(``ignore_eos``, greedy, one logprob per token so every token is one event on both sides):

- HTTP: ``met serve`` in a subprocess (its own interpreter, as in production), streamed with
  httpx (SSE ``/v1/completions``) from this process;
- in-process: the same model and engine flags, ``AsyncEngine.generate`` from asyncio tasks.

Reported per side and concurrency: aggregate output tok/s, time to first token p50/p99 and
inter-token latency p50/p99 (ms), plus HTTP/in-process ratios (throughput ratio < 1 and latency
ratios > 1 are the HTTP overhead).  Not a test: run by hand.

    python bench/bench_http.py [--model PATH] [--max-tokens 32] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import socket
import subprocess
import sys
import time

from bench_args import int_flags  # same folder

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is.",
    "Give two tips for better sleep.",
    "Why is the sky blue?",
    "Describe the water cycle.",
    "Tell me a fun fact about octopuses.",
    "How many legs does a spider have?",
]
ENGINE_FLAGS = ["--kv-cache-memory", "128M", "--max-num-seqs", "16"]


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def summarize(streams: list[tuple[float, list[float]]], wall: float) -> dict:
    """streams: (start, token arrival times) per stream."""
    ttft = [(times[0] - start) * 1000 for start, times in streams if times]
    itl = [(b - a) * 1000 for _, times in streams for a, b in itertools.pairwise(times)]
    tokens = sum(len(times) for _, times in streams)
    return {
        "tok_s": tokens / wall,
        "ttft_p50": pct(ttft, 0.5),
        "ttft_p99": pct(ttft, 0.99),
        "itl_p50": pct(itl, 0.5),
        "itl_p99": pct(itl, 0.99),
        "tokens": tokens,
    }


# --- HTTP --------------------------------------------------------------------------------------


async def http_stream(client, url: str, prompt: str, max_tokens: int) -> tuple[float, list[float]]:
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": 0,
        "stream": True,
    }
    start = time.perf_counter()
    times: list[float] = []
    async with client.stream("POST", url + "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("choices") and event["choices"][0].get("logprobs"):
                now = time.perf_counter()
                times += [now] * len(event["choices"][0]["logprobs"]["tokens"])
    return start, times


async def http_round(url: str, n: int, max_tokens: int) -> dict:
    import httpx

    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=64)) as client:
        start = time.perf_counter()
        streams = await asyncio.gather(
            *(http_stream(client, url, PROMPTS[i % len(PROMPTS)], max_tokens) for i in range(n))
        )
        return summarize(streams, time.perf_counter() - start)


def start_server(model: str | None, threads: int) -> tuple[subprocess.Popen, str]:
    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "metrale_core", "serve", "--port", str(port), *ENGINE_FLAGS]
    if model:
        cmd.append(model)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health").status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit("met serve exited during startup")
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("met serve did not become ready")


# --- in-process ----------------------------------------------------------------------------------


async def engine_stream(async_engine, prompt_ids, max_tokens: int) -> tuple[float, list[float]]:
    from metrale_core.sampling.params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    start = time.perf_counter()
    times: list[float] = []
    async for out in async_engine.generate(prompt_ids, params):
        if out.new_token_ids:
            times += [time.perf_counter()] * len(out.new_token_ids)
    return start, times


async def engine_round(async_engine, tokenizer, n: int, max_tokens: int) -> dict:
    prompts = [tokenizer.encode(PROMPTS[i % len(PROMPTS)]) for i in range(n)]
    start = time.perf_counter()
    streams = await asyncio.gather(*(engine_stream(async_engine, p, max_tokens) for p in prompts))
    return summarize(streams, time.perf_counter() - start)


def in_process(model: str | None, levels: list[int], max_tokens: int) -> dict[int, dict]:
    from metrale_core.cli.flags import add_engine_flags, engine_config_from_args
    from metrale_core.engine import AsyncEngine, LLMEngine
    from metrale_core.loading.load import load_model
    from metrale_core.plugin.discovery import load_registry

    registry = load_registry()
    parser = argparse.ArgumentParser()
    add_engine_flags(parser, registry)
    args = parser.parse_args(ENGINE_FLAGS)
    loaded = load_model(model, registry=registry, progress=False)
    engine = LLMEngine(loaded.model, engine_config_from_args(args), tokenizer=loaded.tokenizer, registry=registry)
    async_engine = AsyncEngine(engine)
    async_engine.start()
    try:
        asyncio.run(engine_round(async_engine, loaded.tokenizer, 1, 4))  # warm-up
        return {n: asyncio.run(engine_round(async_engine, loaded.tokenizer, n, max_tokens)) for n in levels}
    finally:
        async_engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="checkpoint (default: embedded SmolLM2)")
    int_flags(parser, max_tokens=32, threads=2)
    parser.add_argument("--levels", default="1,4,16")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    import torch
    from loguru import logger

    logger.remove()
    torch.set_num_threads(args.threads)

    proc, url = start_server(args.model, args.threads)
    try:
        asyncio.run(http_round(url, 1, 4))  # warm-up
        http = {n: asyncio.run(http_round(url, n, args.max_tokens)) for n in levels}
    finally:
        proc.terminate()
        proc.wait(30)
    local = in_process(args.model, levels, args.max_tokens)

    print(f"{args.max_tokens} tokens per stream, greedy, ignore_eos, logprobs=0; {args.threads} torch threads")
    head = f"{'streams':>7} {'side':<10} {'tok/s':>8} {'TTFT p50':>9} {'p99':>8} {'ITL p50':>8} {'p99':>8}"
    print(head)
    for n in levels:
        for side, r in (("http", http[n]), ("in-proc", local[n])):
            print(
                f"{n:>7} {side:<10} {r['tok_s']:>8.1f} {r['ttft_p50']:>9.1f} {r['ttft_p99']:>8.1f} "
                f"{r['itl_p50']:>8.1f} {r['itl_p99']:>8.1f}"
            )
        h, loc = http[n], local[n]
        print(
            f"{n:>7} {'http/proc':<10} {h['tok_s'] / loc['tok_s']:>8.2f} "
            f"{h['ttft_p50'] / loc['ttft_p50']:>9.2f} {h['ttft_p99'] / loc['ttft_p99']:>8.2f} "
            f"{h['itl_p50'] / loc['itl_p50']:>8.2f} {h['itl_p99'] / loc['itl_p99']:>8.2f}"
        )
    print("(latencies in ms; the http/proc row is HTTP divided by in-process)")


if __name__ == "__main__":
    main()
