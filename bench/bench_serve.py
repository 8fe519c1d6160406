"""Benchmark: ``met serve`` against natively built llama.cpp (and ik_llama.cpp), ratios from one run.

For each model (the embedded SmolLM2-135M Q4_1 and Qwen2.5-Coder-0.5B Q4_K_M), same GGUF, same
prompts, greedy, ``ignore_eos``, one client process (this one: ``metrale_core.bench.sse_client``,
``met bench serve``'s client, for the streams, whose per-token CPU is printed, httpx for the rest):

- ``met serve`` with default flags (plus ``--met-flags``) and ``llama-server -np 16`` over HTTP:
  decode tok/s of 1 stream (SSE, first to last token), prefill tok/s of a ~500-token prompt
  (``max_tokens`` 1, a fresh prompt each time so no prefix cache helps), aggregate tok/s of 16
  concurrent streams (first byte sent to the last stream's end);
- the same build in-process (``LLMEngine`` built from the same default flags, stepped directly):
  the same three figures, so ``HTTP / in-process`` is the serving path's cost;
- the three targets take turns figure by figure within each repetition (``--reps``, medians
  reported), so a noisy machine's slow spells fall on all of them alike and the ratios hold;
- ``met serve``'s peak RSS (VmHWM: load plus all of the above) and start to ``/health`` 200
  (first start in this run, then a warm start);
- llama.cpp's ``system_info`` line (from llama-server's log), and the engine-against-engine stretch
  ratio against ik_llama.cpp's ``llama-bench -t THREADS`` (tg128 / pp512) when built.

Anchors come from ``~/.cache/metrale-anchors/{llamacpp,ik-llamacpp}/bin`` (built natively by
``shared/tools/build-llamacpp.sh`` / ``build-ik-llamacpp.sh``); a missing one prints "not built".
Not a test: run by hand, on a quiet machine if the figures matter.

    python bench/bench_serve.py [--models smollm2,qwen] [--threads 2] [--decode-tokens 64]
                                [--streams 16] [--met-flags "--weight-format int4"]
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import resource
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_args import int_flags  # same folder

from metrale_core.bench.sse_client import SSEClient
from metrale_core.testing.chunked_weights import model_by_name
from metrale_core.testing.serve_argv import llama_server_argv, serve_argv

ANCHORS = Path.home() / ".cache" / "metrale-anchors"
PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a hash table works.",
    "Describe the water cycle in detail.",
    "Give me ten tips for better sleep.",
    "What is the history of the printing press?",
    "Why is the sky blue?",
    "Tell me about the life of octopuses.",
    "How do vaccines train the immune system?",
]
FILLER = "The quick brown fox jumps over the lazy dog while the old cat sleeps by the fire. "
NAN = float("nan")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def peak_rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return NAN


def main_thread_cpu_s(pid: int | None) -> float:
    """CPU seconds of ``pid``'s main thread (in ``met serve`` the event loop): the scheduler's
    nanosecond run time (``schedstat``), not the 10 ms ticks of ``stat``."""
    if pid is None:
        return NAN
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0]) / 1e9


# --- servers -------------------------------------------------------------------------------------


class Server:
    """A server subprocess; ``start_s`` is spawn to ``ready`` (``/health`` 200)."""

    def __init__(self, cmd: list[str], env: dict, port: int, log: Path) -> None:
        import httpx

        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        t0 = time.perf_counter()
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(
                    f"server exited ({self.proc.returncode}): {shlex.join(cmd)}\n"
                    + log.read_text(errors="replace")[-3000:]
                )
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"server did not come up: {shlex.join(cmd)}")
            time.sleep(0.05)
        self.start_s = time.perf_counter() - t0

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def met_serve(path: Path, args, log: Path) -> Server:
    port = free_port()
    cmd = serve_argv(path, port, "bench", *shlex.split(args.met_flags))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    return Server(cmd, env, port, log)


def llama_server(binary: Path, path: Path, args, log: Path) -> Server:
    port = free_port()
    cmd = llama_server_argv(binary, path, args.threads, args.streams, 2048, port)
    return Server(cmd, dict(os.environ), port, log)


def system_info(binary: Path, path: Path, threads: int) -> str:
    """llama.cpp's ``system_info`` line: ``llama-server -v`` prints it first thing (it is quiet
    about it without ``-v``, which the timed server does not get); stopped once it is read."""
    cmd = [str(binary), "-m", str(path), "-t", str(threads), "--port", str(free_port()), "-v"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if "system_info" in line:
                return line.strip()
        return "(no system_info line from llama-server -v)"
    finally:
        proc.kill()
        proc.wait()


# --- over HTTP ---------------------------------------------------------------------------------


def _body(prompt: str, max_tokens: int, stream: bool) -> dict:
    return {
        "model": "bench",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": stream,
    }


def thread_cpu_s() -> float:
    """CPU seconds of the calling thread: the client's own cost, charged to the cores it shares."""
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime


class HttpTarget:
    """One server's three figures over HTTP, one repetition at a time (``rep`` picks the prompt).

    Streams go through :class:`metrale_core.bench.sse_client.SSEClient` (the lean client: httpx costs more CPU per
    token than the server path it would measure); the one-shot prefill request through httpx."""

    def __init__(self, client, url: str, prompt_500: str, args, pid: int | None = None) -> None:
        self.client, self.url, self.prompt_500, self.args, self.pid = client, url, prompt_500, args, pid
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.sse = SSEClient(host, int(port))

    def _stream(self, prompt: str, n: int):
        return self.sse.stream("/v1/completions", _body(prompt, n, True))

    async def warm_up(self) -> None:  # opens the connections
        await asyncio.gather(*(self._stream(PROMPTS[i % len(PROMPTS)], 4) for i in range(self.args.streams)))

    async def decode1(self, rep: int) -> float:
        timing = await self._stream(PROMPTS[rep % len(PROMPTS)], self.args.decode_tokens)
        if timing.events < 2:
            raise SystemExit(
                f"{self.url}: {timing.events} events with text in a {self.args.decode_tokens}-token stream"
            )
        return (self.args.decode_tokens - 1) / (timing.last - timing.first)

    async def prefill(self, rep: int) -> float:
        import httpx

        body = _body(f"{rep} {time.time()} " + self.prompt_500, 1, False)
        t0 = time.perf_counter()
        try:
            r = await self.client.post(self.url + "/v1/completions", json=body)
        except httpx.RemoteProtocolError:  # a kept-alive connection the server had closed
            t0 = time.perf_counter()
            r = await self.client.post(self.url + "/v1/completions", json=body)
        r.raise_for_status()
        return r.json()["usage"]["prompt_tokens"] / (time.perf_counter() - t0)

    async def decode_n(self, rep: int) -> tuple[float, float, float]:
        """(aggregate tok/s, the server's main-thread CPU us per token, the client's CPU us per
        token)."""
        t0, cpu0, client0 = time.perf_counter(), main_thread_cpu_s(self.pid), thread_cpu_s()
        await asyncio.gather(
            *(self._stream(PROMPTS[i % len(PROMPTS)], self.args.decode_tokens) for i in range(self.args.streams))
        )
        tokens = self.args.streams * self.args.decode_tokens
        return (
            tokens / (time.perf_counter() - t0),
            (main_thread_cpu_s(self.pid) - cpu0) / tokens * 1e6,
            (thread_cpu_s() - client0) / tokens * 1e6,
        )


# --- in-process --------------------------------------------------------------------------------


class InProcess:
    """The same three figures from an ``LLMEngine`` built from ``met serve``'s default flags,
    stepped directly in this process."""

    def __init__(self, path: Path, prompt_500: str, args) -> None:
        from metrale_core.cli.flags import engine_config_from_args, load_options_from_args
        from metrale_core.engine import LLMEngine
        from metrale_core.loading.load import load_model
        from metrale_core.plugin.discovery import load_registry

        registry = load_registry()
        flags = met_flags(args, registry)
        loaded = load_model(str(path), load_options_from_args(flags), registry, progress=False)
        self.engine = LLMEngine(
            loaded.model, engine_config_from_args(flags), tokenizer=loaded.tokenizer, registry=registry
        )
        self.tok, self.prompt_500, self.args = loaded.tokenizer, prompt_500, args
        self.short = [self.tok.encode(p) for p in PROMPTS]
        self.counter = iter(range(1 << 30))

    def _run(self, prompts: list[list[int]], n: int) -> tuple[float, float, float, int]:
        from metrale_core.sampling.params import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        for p in prompts:
            self.engine.add_request(f"r{next(self.counter)}", list(p), params)
        t0 = time.perf_counter()
        first = last = NAN
        produced = 0
        while self.engine.has_unfinished():
            got = sum(len(o.new_token_ids) for o in self.engine.step())
            if got:
                last = time.perf_counter()
                first = last if first != first else first
                produced += got
        return t0, first, last, produced

    def warm_up(self) -> None:
        self._run([self.short[i % len(self.short)] for i in range(self.args.streams)], 4)

    def decode1(self, rep: int) -> float:
        _, first, last, n = self._run([self.short[rep % len(self.short)]], self.args.decode_tokens)
        return (n - 1) / (last - first)

    def prefill(self, rep: int) -> float:
        ids = self.tok.encode(f"{rep} {time.time()} " + self.prompt_500)
        t0, first, _, _ = self._run([ids], 1)
        return len(ids) / (first - t0)

    def decode_n(self, rep: int) -> float:
        t0, _, last, n = self._run(
            [self.short[i % len(self.short)] for i in range(self.args.streams)], self.args.decode_tokens
        )
        return n / (last - t0)


#: Each figure and the method of a target (``HttpTarget`` / ``InProcess``) that measures it.
FIGURES = {"decode1": "decode1", "prefill": "prefill", "decodeN": "decode_n"}


async def _settled(value):
    """``value``, awaited first when a coroutine (the HTTP targets' methods are, in-process not)."""
    return await value if inspect.isawaitable(value) else value


async def interleaved(targets: dict, args) -> dict:
    """Each figure of each target, repetition by repetition, the targets taking turns within a
    repetition: a noisy machine's slow spells fall on all of them alike, so the ratios hold."""
    figures: dict = {name: {**{f: [] for f in FIGURES}, "loop": [], "client": []} for name in targets}
    for target in targets.values():
        await _settled(target.warm_up())
    for rep in range(args.reps):
        for figure, method in FIGURES.items():
            for name, target in targets.items():
                value = await _settled(getattr(target, method)(rep))
                if isinstance(value, tuple):
                    value, loop_us, client_us = value
                    figures[name]["loop"].append(loop_us)
                    figures[name]["client"].append(client_us)
                figures[name][figure].append(value)
        print(
            f"  rep {rep + 1}: "
            + "; ".join(f"{name} " + "/".join(f"{figures[name][f][-1]:.1f}" for f in FIGURES) for name in targets),
            file=sys.stderr,
            flush=True,
        )
    return {
        name: {
            **{figure: statistics.median(f[figure]) for figure in FIGURES},
            **({"loop_us_per_token": statistics.median(f["loop"])} if f["loop"] else {}),
            **({"client_us_per_token": statistics.median(f["client"])} if f["client"] else {}),
        }
        for name, f in figures.items()
    }


async def measure(servers: dict, inproc: InProcess, prompt_500: str, args) -> dict:
    import httpx

    limits = httpx.Limits(max_connections=2 * args.streams + 8, max_keepalive_connections=2 * args.streams + 8)
    async with httpx.AsyncClient(timeout=900, limits=limits) as client:
        targets: dict = {}
        for name, srv in servers.items():
            targets[name] = HttpTarget(client, srv.url, prompt_500, args, srv.proc.pid if name == "met_http" else None)
            if name == "met_http":
                targets["met_inproc"] = inproc
        return await interleaved(targets, args)


# --- llama-bench ---------------------------------------------------------------------------------


def llama_bench(binary: Path, path: Path, threads: int) -> dict:
    out = subprocess.run(
        [str(binary), "-m", str(path), "-t", str(threads), "-p", "512", "-n", "128", "-r", "3", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = json.loads(out.stdout)
    res = {}
    for row in rows:
        key = "pp512" if row.get("n_prompt") else "tg128"
        res[key] = row["avg_ts"]
    return res


# --- main --------------------------------------------------------------------------------------


def bench_model(name: str, args, logs: Path) -> dict:
    import torch

    from metrale_core.text.tokenizer import Tokenizer
    from metrale_core.weights import open_weights

    path = model_by_name(name)
    tok = Tokenizer.from_store(open_weights(path))
    ids = tok.encode(FILLER * 60)[: args.prefill_tokens]
    prompt_500 = tok.decode(ids)
    row: dict = {"model": name, "file": path.name, "gguf_mb": path.stat().st_size / 2**20}

    met = met_serve(path, args, logs / f"met-{name}.log")
    row["health_first_s"] = met.start_s
    print(f"[{name}] met serve up in {met.start_s:.1f} s", file=sys.stderr, flush=True)
    servers = {"met_http": met}
    binary = args.llamacpp_bin / "llama-server"
    try:
        torch.set_num_threads(args.threads)
        inproc = InProcess(path, prompt_500, args)
        if binary.exists():
            servers["llama_http"] = llama_server(binary, path, args, logs / f"llama-server-{name}.log")
        row.update(asyncio.run(measure(servers, inproc, prompt_500, args)))
        row["met_rss_mb"] = peak_rss_mb(met.proc.pid)
        if "llama_http" in servers:
            row["llama_rss_mb"] = peak_rss_mb(servers["llama_http"].proc.pid)
    finally:
        for srv in servers.values():
            srv.stop()
    del inproc
    warm = met_serve(path, args, logs / f"met-{name}-warm.log")
    row["health_warm_s"] = warm.start_s
    warm.stop()
    for key in ("met_http", "met_inproc", "llama_http"):
        if key in row:
            print(f"[{name}] {key}: {row[key]}", file=sys.stderr, flush=True)
    if binary.exists():
        row["llama_system_info"] = system_info(binary, path, args.threads)
    ik = args.ik_bin / "llama-bench"
    row["ik"] = llama_bench(ik, path, args.threads) if ik.exists() else None
    return row


def met_flags(args, registry=None) -> argparse.Namespace:
    """``met serve``'s engine flags as the benchmark passes them (``--met-flags``; defaults else)."""
    from metrale_core.cli.flags import add_engine_flags
    from metrale_core.plugin.discovery import load_registry

    parser = argparse.ArgumentParser()
    parser.add_argument("--no-tui", action="store_true")
    add_engine_flags(parser, registry if registry is not None else load_registry())
    return parser.parse_args(shlex.split(args.met_flags))


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b == b and b else "n/a"


def report(rows: list[dict], args) -> None:
    print(
        f"\n{args.threads} threads, greedy, ignore_eos, {args.decode_tokens} tokens per stream, "
        f"{args.streams} streams, prefill ~{args.prefill_tokens} tokens, median of {args.reps}; "
        f"met serve flags: {args.met_flags or '(default)'}; load avg {os.getloadavg()[0]:.2f}"
    )
    from metrale_core.kernels.cpu import selected_isa

    isa, why = selected_isa()
    print(f"met C kernels: the {isa or 'torch (no C)'} build ({why})")
    for row in rows:
        print(f"\n== {row['file']} ({row['gguf_mb']:.0f} MiB)")
        if "llama_system_info" in row:
            print(f"llama.cpp {row['llama_system_info']}")
        else:
            print(f"llama-server: not built ({args.llamacpp_bin})")
        print(f"{'engine':<22} {'decode 1':>9} {'prefill':>9} {f'{args.streams} streams':>11}")
        for key, label in (
            ("met_http", "met serve (HTTP)"),
            ("met_inproc", "met in-process"),
            ("llama_http", "llama-server (HTTP)"),
        ):
            if key in row:
                r = row[key]
                print(f"{label:<22} {r['decode1']:>9.1f} {r['prefill']:>9.1f} {r['decodeN']:>11.1f}")
        ik = row["ik"]
        print(
            "ik_llama.cpp llama-bench: "
            + (f"tg128 {ik.get('tg128', NAN):.1f}, pp512 {ik.get('pp512', NAN):.1f}" if ik else "not built")
        )
        print(
            f"CPU per token at {args.streams} streams: met serve event loop (main thread) "
            f"{row['met_http']['loop_us_per_token']:.0f} us; the client (this process, on the same cores) "
            + ", ".join(
                f"{row[key]['client_us_per_token']:.0f} us against {label}"
                for key, label in (("met_http", "met serve"), ("llama_http", "llama-server"))
                if key in row
            )
        )
        kv_mb = met_flags(args).kv_cache_memory / 2**20
        print(
            f"met serve peak RSS {row['met_rss_mb']:.0f} MiB (target: GGUF {row['gguf_mb']:.0f} + KV pool "
            f"{kv_mb:.0f} + 400 = {row['gguf_mb'] + kv_mb + 400:.0f} MiB); "
            + (f"llama-server {row['llama_rss_mb']:.0f} MiB; " if "llama_rss_mb" in row else "")
            + f"start to /health 200: first {row['health_first_s']:.1f} s, "
            f"warm {row['health_warm_s']:.1f} s"
        )
    print(f"\n{'ratios':<34} " + " ".join(f"{r['model']:>9}" for r in rows))
    lines = []
    for label, num, den, key in (
        ("decode 1: met HTTP / llama-server", "met_http", "llama_http", "decode1"),
        ("prefill: met HTTP / llama-server", "met_http", "llama_http", "prefill"),
        (f"{args.streams} streams: met HTTP / llama-server", "met_http", "llama_http", "decodeN"),
        ("decode 1: HTTP / in-process", "met_http", "met_inproc", "decode1"),
        ("prefill: HTTP / in-process", "met_http", "met_inproc", "prefill"),
        (f"{args.streams} streams: HTTP / in-process", "met_http", "met_inproc", "decodeN"),
    ):
        lines.append((label, [_ratio(r[num][key], r[den][key]) if num in r and den in r else "n/a" for r in rows]))
    for label, key, ik_key in (
        ("in-proc decode 1 / ik tg128", "decode1", "tg128"),
        ("in-proc prefill / ik pp512", "prefill", "pp512"),
    ):
        lines.append((label, [_ratio(r["met_inproc"][key], r["ik"][ik_key]) if r["ik"] else "not built" for r in rows]))
    for label, cells in lines:
        print(f"{label:<34} " + " ".join(f"{c:>9}" for c in cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--models", default="smollm2,qwen", help="comma list: smollm2, qwen, or GGUF paths (default: smollm2,qwen)"
    )
    int_flags(ap, threads=2, decode_tokens=64, streams=16, prefill_tokens=500)
    ap.add_argument("--reps", type=int, default=3, help="repetitions per figure (median)")
    ap.add_argument("--met-flags", default="", help="extra met serve flags (default: none)")
    ap.add_argument("--llamacpp-bin", type=Path, default=ANCHORS / "llamacpp" / "bin")
    ap.add_argument("--ik-bin", type=Path, default=ANCHORS / "ik-llamacpp" / "bin")
    ap.add_argument("--json", type=Path, default=None, help="also write the raw figures here")
    args = ap.parse_args()

    from loguru import logger

    logger.remove()
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        rows = [bench_model(name, args, Path(tmp)) for name in args.models.split(",")]
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    report(rows, args)


if __name__ == "__main__":
    main()
