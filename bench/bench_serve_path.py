"""Benchmark: CPU the serving path spends per streamed token, with no model cost in the way.

``met serve``'s app (real uvicorn, its own process) on the tests' scripted model (a forward that
costs next to nothing), 1 and 16 SSE streams of 256 tokens from this process; prints the server
process's CPU time (user + system, from /proc) per streamed token, its event loop's (main thread)
per token and per SSE event, the events sent and the rate.  The figure is what the event loop, the
engine bridge and the engine's bookkeeping cost a real model's step on a 2-core machine.  Compare
two builds back to back (same load).  Not a test.

    python bench/bench_serve_path.py [--port 18771] [--tokens 256] [--step-ms 0]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_args import int_flags  # same folder

from metrale_core.bench.sse_client import SSEClient

REPO = Path(__file__).resolve().parents[1]


def serve(port: int, step_ms: float) -> None:
    sys.path.insert(0, str(REPO / "tests" / "server"))
    from loguru import logger
    from server_testlib import ScriptedLM, write_tokenizer

    from metrale_core.engine import EngineConfig, LLMEngine
    from metrale_core.server import ServedModel, ServerConfig, create_app
    from metrale_core.server.runner import serve_forever
    from metrale_core.text.tokenizer import Tokenizer

    logger.remove()
    tok = Tokenizer.from_dir(write_tokenizer(Path(tempfile.mkdtemp())))
    config = EngineConfig(block_size=16, num_kv_blocks=1024, max_num_seqs=32, max_prefill_tokens=2048)

    class PacedLM(ScriptedLM):
        """A step that takes ``step_ms`` without the GIL or a core, as a real forward's C kernels
        hold neither: the engine then runs at a model's pace and events are not coalesced."""

        def forward(self, *args, **kwargs):
            time.sleep(step_ms / 1000)
            return super().forward(*args, **kwargs)

    def load():
        engine = LLMEngine(PacedLM(tok) if step_ms else ScriptedLM(tok), config, tokenizer=tok)
        return ServedModel(engine=engine, tokenizer=tok, model_type="llama")

    serve_forever(create_app(ServerConfig(served_model_name="s"), load), "127.0.0.1", port, 1.0)


def main() -> None:
    import httpx

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    int_flags(ap, port=18771, tokens=256)
    ap.add_argument("--step-ms", type=float, default=0.0, help="pace each engine step (sleeps, no CPU)")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args.port, args.step_ms)
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--port", str(args.port), "--step-ms", str(args.step_ms)]
    )
    url = f"http://127.0.0.1:{args.port}"
    while True:
        try:
            if httpx.get(url + "/health").status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.2)

    def cpu(task: str = "") -> float:
        """CPU seconds of the server process's live threads, or of its main thread (the event
        loop): the scheduler's nanosecond run time (``schedstat``), not the 10 ms ticks of ``stat``."""
        tasks = [task] if task else [p.name for p in Path(f"/proc/{proc.pid}/task").iterdir()]
        total = 0
        for t in tasks:
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                total += int(Path(f"/proc/{proc.pid}/task/{t}/schedstat").read_text().split()[0])
        return total / 1e9

    client = SSEClient("127.0.0.1", args.port)

    async def one(n: int) -> int:
        body = {"model": "s", "prompt": "hello", "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True}
        return (await client.stream("/v1/completions", body)).events

    async def run() -> None:
        await asyncio.gather(*(one(8) for _ in range(16)))  # warm-up: opens the connections
        for streams in (1, 16):
            c0, l0, t0 = cpu(), cpu(str(proc.pid)), time.perf_counter()
            events = sum(await asyncio.gather(*(one(args.tokens) for _ in range(streams))))
            tokens = args.tokens * streams
            loop_us = (cpu(str(proc.pid)) - l0) * 1e6
            print(
                f"{streams:>2} streams: server CPU {(cpu() - c0) / tokens * 1e6:.0f} us/token, event loop "
                f"{loop_us / tokens:.0f} us/token ({loop_us / max(events, 1):.0f} us/event), "
                f"{events} events, {tokens / (time.perf_counter() - t0):.0f} tok/s",
                flush=True,
            )

    try:
        asyncio.run(run())
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
