"""Soak: N requests against ``met serve`` (a subprocess), latency and server RSS per window.

A fixed mix, cycled: chat (whole and streamed), completions (whole and streamed), a
``/tokenize``, one bad request (400) and one large prompt (~1 MB, refused before tokenizing)
per cycle.  Every ``--window`` requests it prints the window's p50/p99 latency (ms) and the
server's RSS (MiB, from ``/proc/PID/status``); a flat RSS column means no leak (issue 16, item
14).  Not a test: run by hand.

    python bench/soak_http.py [--model PATH | --tiny] [--requests 2000] [--window 500]

``--tiny`` serves a randomly initialised two-layer Qwen3 (hidden size 64) with the real Qwen3
tokenizer (``scripts/fetch-test-data.sh``), written to a temporary directory with
transformers: the model costs almost nothing, so the soak measures the server itself
(parsing, templates, tokenizer, streaming, admission) on a busy machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time

import httpx


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def requests_mix(max_tokens: int) -> list[tuple[str, dict, int]]:
    """(path, body, expected status) of one cycle."""
    chat = {"messages": [{"role": "user", "content": "Name a colour."}], "temperature": 0,
            "max_tokens": max_tokens}
    comp = {"prompt": "Once upon a time", "temperature": 0, "max_tokens": max_tokens}
    return [
        ("/v1/chat/completions", chat, 200),
        ("/v1/chat/completions", {**chat, "stream": True}, 200),
        ("/v1/completions", comp, 200),
        ("/v1/completions", {**comp, "stream": True}, 200),
        ("/tokenize", {"prompt": "hello world " * 50}, 200),
        ("/v1/chat/completions", {**chat, "logit_bias": {"99999999": 1}}, 400),
        ("/v1/completions", {"prompt": "z" * (1 << 20), "max_tokens": 1}, 400),
        ("/v1/chat/completions", {**chat, "seed": 7, "temperature": 0.8}, 200),
    ]


async def one(client: httpx.AsyncClient, url: str, path: str, body: dict, status: int) -> float:
    start = time.perf_counter()
    if body.get("stream"):
        async with client.stream("POST", url + path, json=body) as resp:
            async for _ in resp.aiter_bytes():
                pass
    else:
        resp = await client.post(url + path, json=body)
    if resp.status_code != status:
        raise SystemExit(f"{path}: expected {status}, got {resp.status_code}: {resp.text[:200]}")
    return (time.perf_counter() - start) * 1000


async def soak(url: str, pid: int, total: int, window: int, concurrency: int,
               max_tokens: int) -> None:
    mix = requests_mix(max_tokens)
    queue: asyncio.Queue = asyncio.Queue()
    for i in range(total):
        queue.put_nowait(mix[i % len(mix)])
    latencies: list[float] = []
    done = 0
    print(f"{'requests':>9} {'p50 ms':>9} {'p99 ms':>9} {'RSS MiB':>9}", flush=True)
    print(f"{0:>9} {'-':>9} {'-':>9} {rss_mib(pid):>9.1f}", flush=True)
    lock = asyncio.Lock()

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal done, latencies
        while not queue.empty():
            path, body, status = queue.get_nowait()
            ms = await one(client, url, path, body, status)
            async with lock:
                latencies.append(ms)
                done += 1
                if done % window == 0:
                    print(f"{done:>9} {pct(latencies, 0.5):>9.1f} {pct(latencies, 0.99):>9.1f} "
                          f"{rss_mib(pid):>9.1f}", flush=True)
                    latencies = []

    async with httpx.AsyncClient(timeout=300) as client:
        await asyncio.gather(*[worker(client) for _ in range(concurrency)])


def tiny_checkpoint(directory: str) -> str:
    """A random two-layer Qwen3 with the Qwen3 tokenizer, saved in ``directory``."""
    import shutil

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok_dir = os.environ.get("METRALE_QWEN3_TOKENIZER_DIR",
                             os.path.expanduser("~/.cache/metrale/tokenizers/qwen3"))
    config = Qwen3Config(vocab_size=151936, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, max_position_embeddings=4096, tie_word_embeddings=True)
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, name), directory)
    return directory


def start_server(model: str | None, threads: int) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "metrale_core.cli.main", "serve", "--no-tui", "--port",
           str(port), "--threads", str(threads), "--kv-cache-memory", "128M",
           "--max-num-seqs", "8"]
    if model:
        cmd.insert(4, model)
    env = {**os.environ, "METRALE_NO_TUI": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("met serve exited during startup")
        try:
            if httpx.get(url + "/health").status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("met serve did not become ready")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--tiny", action="store_true",
                        help="serve a random two-layer Qwen3 (measures the server, not the model)")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--window", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import tempfile

    tmp = tempfile.TemporaryDirectory()
    model = tiny_checkpoint(tmp.name) if args.tiny else args.model
    proc, url = start_server(model, args.threads)
    try:
        started = time.perf_counter()
        asyncio.run(soak(url, proc.pid, args.requests, args.window, args.concurrency,
                         args.max_tokens))
        print(f"{args.requests} requests in {time.perf_counter() - started:.1f}s", flush=True)
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()
