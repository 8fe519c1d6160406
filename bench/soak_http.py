"""Soak: N requests against ``met serve`` (a subprocess), latency and server RSS per window.

A fixed mix, cycled: chat (whole and streamed), completions (whole and streamed), a
``/tokenize``, one bad request (400) and one large prompt (~1 MB, refused before tokenizing)
per cycle.  Every ``--window`` requests it prints the window's p50/p99 latency (ms) and the
server's RSS (MiB, from ``/proc/PID/status``); a flat RSS column means no leak (issue 16, item
14).  Not a test: run by hand.

    python bench/soak_http.py [--model PATH | --tiny] [--requests 2000] [--window 500]
                              [--full [--lora]] [--met-flags '--weight-format int4'] [--trace DIR]

``--full`` cycles the real mix of issue 33 instead: the above plus tools (auto and forced
``required``, streamed), ``json_schema``, ``n=3``, Responses and Messages (whole and streamed),
embeddings, Ollama's ``/api/chat`` and ``/api/generate`` (NDJSON), a stream the client drops after
its first bytes, and three more 400s; ``--lora`` adds a
random SmolLM2-shaped PEFT adapter (``--lora soak-lora=DIR``) and chat / completion requests to it.
Every request's status is checked (a wrong one stops the soak), and at the end ``/metrics`` must
show the engine idle (0 running, 0 waiting, 0 KV use).

``--trace DIR`` tells leak from allocator high-water: the server runs under ``tracemalloc``
(10 frames) and, at every window, writes ``DIR/snap-N.pickle`` (a tracemalloc snapshot), and
prints Python-traced MiB, live gc objects, and RSS before and after ``malloc_trim(0)``; at the
end the top growth between the second and the last snapshot is printed by allocation site (a
leak shows as a site that grows with the request count; high-water shows as RSS that falls
back after ``malloc_trim`` while traced memory stays flat).

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
from bench_args import int_flags  # same folder

from metrale_core.testing.tools import weather_tool


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


WEATHER_TOOL = weather_tool("The weather in a city")
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def requests_mix(
    max_tokens: int, model: str, lora: str | None = None, full: bool = False
) -> list[tuple[str, dict, int]]:
    """(path, body, expected status) of one cycle.  ``full`` adds the real mix of issue 33 (tools,
    forced tools, json_schema, n > 1, the LoRA adapter ``lora``, Responses, Messages, embeddings,
    a dropped stream, more 400s); a body with ``"disconnect": True`` is a stream the client drops
    after its first bytes (the server must abort it and free its blocks)."""
    chat = {
        "model": model,
        "messages": [{"role": "user", "content": "Name a colour."}],
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    comp = {"model": model, "prompt": "Once upon a time", "temperature": 0, "max_tokens": max_tokens}
    mix = [
        ("/v1/chat/completions", chat, 200),
        ("/v1/chat/completions", {**chat, "stream": True}, 200),
        ("/v1/completions", comp, 200),
        ("/v1/completions", {**comp, "stream": True}, 200),
        ("/tokenize", {"prompt": "hello world " * 50}, 200),
        ("/v1/chat/completions", {**chat, "logit_bias": {"99999999": 1}}, 400),
        ("/v1/completions", {"prompt": "z" * (1 << 20), "max_tokens": 1}, 400),
        ("/v1/chat/completions", {**chat, "seed": 7, "temperature": 0.8}, 200),
    ]
    if not full:
        return mix
    weather = {**chat, "messages": [{"role": "user", "content": "What is the weather in Paris?"}]}
    messages = {"model": model, "max_tokens": max_tokens, "messages": chat["messages"]}
    ollama = {"model": model, "stream": False, "options": {"temperature": 0, "num_predict": max_tokens}}
    mix += [
        ("/v1/chat/completions", {**weather, "tools": [WEATHER_TOOL], "max_tokens": 48}, 200),
        (
            "/v1/chat/completions",
            {**weather, "tools": [WEATHER_TOOL], "tool_choice": "required", "max_tokens": 64, "stream": True},
            200,
        ),
        (
            "/v1/chat/completions",
            {
                **chat,
                "max_tokens": 48,
                "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
            },
            200,
        ),
        ("/v1/chat/completions", {**chat, "n": 3, "temperature": 0.7, "seed": 1}, 200),
        ("/v1/responses", {"model": model, "input": "Name a colour.", "max_output_tokens": max_tokens}, 200),
        (
            "/v1/responses",
            {"model": model, "input": "Name a fruit.", "max_output_tokens": max_tokens, "stream": True},
            200,
        ),
        ("/v1/messages", messages, 200),
        ("/v1/messages", {**messages, "stream": True}, 200),
        ("/v1/embeddings", {"model": model, "input": ["a red apple", "a green pear"]}, 200),
        ("/v1/chat/completions", {**chat, "max_tokens": 200, "stream": True, "disconnect": True}, 200),
        ("/v1/chat/completions", {**chat, "temperature": 5}, 400),
        ("/v1/messages", {"model": model, "messages": chat["messages"]}, 400),  # max_tokens is required
        ("/api/chat", {**ollama, "messages": chat["messages"]}, 200),
        ("/api/generate", {**ollama, "prompt": "Once upon a time", "stream": True}, 200),
        ("/api/chat", {**ollama, "messages": chat["messages"], "options": {"temperature": -1}}, 400),
    ]
    if lora is not None:
        mix += [
            ("/v1/chat/completions", {**chat, "model": lora}, 200),
            ("/v1/completions", {**comp, "model": lora, "stream": True}, 200),
        ]
    return mix


async def one(client: httpx.AsyncClient, url: str, path: str, body: dict, status: int) -> float:
    start = time.perf_counter()
    disconnect = body.get("disconnect", False)
    body = {k: v for k, v in body.items() if k != "disconnect"}
    if body.get("stream"):
        async with client.stream("POST", url + path, json=body) as resp:
            async for _ in resp.aiter_bytes():
                if disconnect:
                    break
    else:
        resp = await client.post(url + path, json=body)
    if resp.status_code != status:
        raise SystemExit(f"{path}: expected {status}, got {resp.status_code}: {resp.text[:200]}")
    return (time.perf_counter() - start) * 1000


def cpu_line() -> str:
    """This machine's CPU and the features the kernels pick by (every benchmark prints it)."""
    from metrale_core.bench.report import machine_info, machine_line

    return "machine: " + machine_line(machine_info())


def gauges(url: str) -> str:
    """The engine's running / waiting requests and KV use from ``/metrics`` (all 0 when idle)."""
    text = httpx.get(url + "/metrics", timeout=30).text
    wanted = ("metrale:num_requests_running", "metrale:num_requests_waiting", "metrale:kv_cache_usage_perc")
    found = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in wanted:
            found[name.split(":", 1)[1]] = float(line.rsplit(" ", 1)[1])
    return ", ".join(f"{k} {v:g}" for k, v in found.items())


async def soak(
    url: str,
    pid: int,
    total: int,
    window: int,
    concurrency: int,
    max_tokens: int,
    trace: str | None = None,
    full: bool = False,
    lora: str | None = None,
) -> None:
    model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
    mix = requests_mix(max_tokens, model, lora, full)
    print(f"mix of {len(mix)} requests per cycle, model {model}", flush=True)
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
                    print(
                        f"{done:>9} {pct(latencies, 0.5):>9.1f} {pct(latencies, 0.99):>9.1f} {rss_mib(pid):>9.1f}",
                        flush=True,
                    )
                    latencies = []
                    if trace:
                        print(traced_window(trace, pid, done // window), flush=True)

    async with httpx.AsyncClient(timeout=300) as client:
        await asyncio.gather(*[worker(client) for _ in range(concurrency)])


def tiny_checkpoint(directory: str) -> str:
    """A random two-layer Qwen3 with the Qwen3 tokenizer, saved in ``directory``."""
    import shutil

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok_dir = os.environ.get("METRALE_QWEN3_TOKENIZER_DIR", os.path.expanduser("~/.cache/metrale/tokenizers/qwen3"))
    config = Qwen3Config(
        vocab_size=151936,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, name), directory)
    return directory


def smollm2_adapter(directory: str) -> str:
    """A random rank-8 PEFT LoRA adapter (q/k/v/o) shaped for SmolLM2-135M, saved in ``directory``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(  # SmolLM2-135M's shapes; a tiny vocabulary, since the adapter has no embeddings
        vocab_size=64,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    lora = LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], init_lora_weights=False
    )
    get_peft_model(LlamaForCausalLM(config), lora).save_pretrained(directory)
    return directory


def serve_traced(directory: str, argv: list[str]) -> None:
    """The ``--serve-traced`` mode: ``met serve`` under tracemalloc; SIGUSR1 writes a snapshot
    and a JSON line of counters to ``directory`` (the soak's driver reads them)."""
    import ctypes
    import gc
    import json
    import signal
    import tracemalloc

    tracemalloc.start(10)
    libc = ctypes.CDLL("libc.so.6")
    taken = [0]

    def dump(signum, frame) -> None:
        gc.collect()
        n = taken[0] = taken[0] + 1
        snapshot = tracemalloc.take_snapshot()
        snapshot.dump(os.path.join(directory, f"snap-{n}.pickle"))
        by_type: dict[str, int] = {}
        for obj in gc.get_objects():
            name = type(obj).__name__
            by_type[name] = by_type.get(name, 0) + 1
        before = rss_mib(os.getpid())
        libc.malloc_trim(0)
        record = {
            "n": n,
            "traced_mib": tracemalloc.get_traced_memory()[0] / 2**20,
            "objects": sum(by_type.values()),
            "rss_mib": before,
            "rss_after_trim_mib": rss_mib(os.getpid()),
            "top_types": sorted(by_type.items(), key=lambda kv: -kv[1])[:40],
        }
        with open(os.path.join(directory, f"counts-{n}.json"), "w") as f:
            json.dump(record, f)

    signal.signal(signal.SIGUSR1, dump)
    from metrale_core.cli.main import main as met_main

    raise SystemExit(met_main(argv))


def traced_window(directory: str, pid: int, n: int) -> str:
    """Ask the traced server for snapshot ``n``; its counters as one line."""
    import json
    import signal

    path = os.path.join(directory, f"counts-{n}.json")
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + 300
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)
    with open(path) as f:
        r = json.load(f)
    return (
        f"  traced {r['traced_mib']:.1f} MiB, {r['objects']} gc objects, RSS "
        f"{r['rss_mib']:.1f} -> {r['rss_after_trim_mib']:.1f} MiB after malloc_trim(0)"
    )


def traced_growth(directory: str, first: int, last: int, top: int = 15) -> None:
    """Print the allocation sites that grew most between two snapshots, and the type counts."""
    import json
    import tracemalloc

    a = tracemalloc.Snapshot.load(os.path.join(directory, f"snap-{first}.pickle"))
    b = tracemalloc.Snapshot.load(os.path.join(directory, f"snap-{last}.pickle"))
    stats = b.compare_to(a, "traceback")
    print(
        f"traced growth, snapshot {first} -> {last}: "
        f"{sum(s.size_diff for s in stats) / 1024:+.1f} KiB in total; top sites:"
    )
    for stat in stats[:top]:
        frame = stat.traceback[-1]
        print(f"  {stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks  {frame.filename}:{frame.lineno}")
    with open(os.path.join(directory, f"counts-{first}.json")) as f:
        ta = dict(json.load(f)["top_types"])
    with open(os.path.join(directory, f"counts-{last}.json")) as f:
        tb = dict(json.load(f)["top_types"])
    grown = sorted(((tb.get(k, 0) - ta.get(k, 0), k) for k in tb), reverse=True)[:10]
    print("gc object count growth by type: " + ", ".join(f"{k} {d:+d}" for d, k in grown))


def start_server(
    model: str | None, threads: int, trace: str | None = None, extra: list[str] | None = None
) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "metrale_core.cli.main",
        "serve",
        "--no-tui",
        "--port",
        str(port),
        "--threads",
        str(threads),
        "--kv-cache-memory",
        "128M",
        "--max-num-seqs",
        "8",
        *(extra or []),
    ]
    if model:
        cmd.insert(4, model)
    if trace:
        cmd[1:3] = [os.path.abspath(__file__), "--serve-traced", trace, "--"]
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
    parser.add_argument(
        "--tiny", action="store_true", help="serve a random two-layer Qwen3 (measures the server, not the model)"
    )
    int_flags(parser, requests=2000, window=500, concurrency=4, max_tokens=4, threads=2)
    parser.add_argument(
        "--full",
        action="store_true",
        help="the real mix (issue 33): tools, json_schema, n>1, Responses, Messages, embeddings, drops, 400s",
    )
    parser.add_argument(
        "--lora",
        action="store_true",
        help="with --full, serve a random SmolLM2-shaped PEFT adapter as 'soak-lora' and send it requests",
    )
    parser.add_argument("--met-flags", default="", help="extra met serve flags, e.g. '--weight-format int4'")
    parser.add_argument(
        "--trace",
        default=None,
        metavar="DIR",
        help="run the server under tracemalloc; snapshots and counters per window",
    )
    args = parser.parse_args()
    import tempfile

    tmp = tempfile.TemporaryDirectory()
    model = tiny_checkpoint(tmp.name) if args.tiny else args.model
    if args.trace:
        os.makedirs(args.trace, exist_ok=True)
    extra = args.met_flags.split()
    lora = None
    if args.lora:
        lora = "soak-lora"
        extra += ["--lora", f"{lora}={smollm2_adapter(os.path.join(tmp.name, 'adapter'))}"]
    proc, url = start_server(model, args.threads, args.trace, extra)
    try:
        print(cpu_line(), flush=True)
        started = time.perf_counter()
        asyncio.run(
            soak(
                url,
                proc.pid,
                args.requests,
                args.window,
                args.concurrency,
                args.max_tokens,
                args.trace,
                full=args.full,
                lora=lora,
            )
        )
        print(f"{args.requests} requests in {time.perf_counter() - started:.1f}s; idle: {gauges(url)}", flush=True)
        windows = args.requests // args.window
        if args.trace and windows >= 2:
            traced_growth(args.trace, min(2, windows - 1), windows)
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--serve-traced":
        serve_traced(sys.argv[2], sys.argv[4:])
    else:
        main()
