"""Benchmark: data parallel against threads, 16-stream aggregate tok/s over HTTP.

``met serve`` on the embedded model (default flags otherwise), greedy, ``ignore_eos``, one client
process (this one, httpx/asyncio), each configuration started fresh:

- ``DP=2 x 1 thread``: ``--data-parallel-size 2 --threads 1`` (two replica processes);
- ``DP=1 x 2 threads``: ``--threads 2`` (one in-process engine);
- (``--configs dp1x1``) ``DP=1 x 1 thread``: a reference for a machine too busy for two threads.

For each: start to ``/health`` 200, then (after a warm-up that opens the connections) the
aggregate tok/s of ``--streams`` concurrent streams of ``--decode-tokens`` tokens (first request
sent to the last stream's end; median of ``--reps``), and, under DP, how many requests each
replica got (``metrale:replica_requests_routed_total``).  Not a test: run by hand, on a quiet
machine if the figures matter.

    python bench/bench_dataparallel.py [--streams 16] [--decode-tokens 64] [--reps 2]
                                       [--met-flags "--weight-format int4"] [--configs dp2x1,dp1x2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_args import int_flags  # same folder

sys.path.insert(0, str(Path(__file__).parent))

from bench_serve import PROMPTS, Server, _body, free_port

from metrale_core.bench.sse_client import SSEClient
from metrale_core.testing.serve_argv import serve_argv

#: name -> (replicas, threads each); the first two are the comparison, the third a reference (on a
#: busy machine two threads can be slower than one).
CONFIGS = {"dp2x1": ("DP=2 x 1 thread", 2, 1), "dp1x2": ("DP=1 x 2 threads", 1, 2), "dp1x1": ("DP=1 x 1 thread", 1, 1)}


def start(dp: int, threads: int, args, log: Path) -> Server:
    port = free_port()
    cmd = serve_argv(None, port, "bench", "--threads", str(threads), *shlex.split(args.met_flags))
    if dp > 1:
        cmd += ["--data-parallel-size", str(dp)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    return Server(cmd, env, port, log)


async def aggregate(url: str, args) -> float:
    """Aggregate decode tok/s of ``args.streams`` concurrent SSE streams (median of the reps)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sse = SSEClient(host, int(port))

    def streams(n: int):
        return [sse.stream("/v1/completions", _body(PROMPTS[i % len(PROMPTS)], n, True)) for i in range(args.streams)]

    await asyncio.gather(*streams(4))  # opens the connections
    rates = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        await asyncio.gather(*streams(args.decode_tokens))
        rates.append(args.streams * args.decode_tokens / (time.perf_counter() - t0))
    sse.close()
    return statistics.median(rates)


def routed(url: str) -> str:
    import httpx

    spread = []
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("metrale:replica_requests_routed_total{"):
            replica = line.split('replica="')[1].split('"')[0]
            spread.append(f"replica {replica}: {float(line.rsplit(' ', 1)[1]):.0f}")
    return ", ".join(spread) or "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    int_flags(parser, streams=16, decode_tokens=64, reps=2)
    parser.add_argument("--met-flags", default="", help="extra flags for met serve")
    parser.add_argument("--configs", default="dp2x1,dp1x2", help=f"from {', '.join(CONFIGS)}")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as logs:
        for key in args.configs.split(","):
            name, dp, threads = CONFIGS[key]
            server = start(dp, threads, args, Path(logs) / f"{key}.log")
            try:
                rate = asyncio.run(aggregate(server.url, args))
                rows.append((name, server.start_s, rate, routed(server.url)))
            finally:
                server.stop()
            print(f"{name}: {rate:.1f} tok/s", file=sys.stderr, flush=True)
    print(
        f"\n{args.streams} streams x {args.decode_tokens} tokens, embedded model, os.cpu_count()="
        f"{os.cpu_count()}, flags: {args.met_flags or '(defaults)'}\n"
    )
    print("| configuration | start to ready (s) | aggregate tok/s | requests per replica |")
    print("|---|---|---|---|")
    for name, start_s, rate, spread in rows:
        print(f"| {name} | {start_s:.1f} | {rate:.1f} | {spread} |")
    for name, _, rate, _ in rows[1:]:
        print(f"{rows[0][0]} / {name}: {rows[0][2] / rate:.2f}x")


if __name__ == "__main__":
    main()
