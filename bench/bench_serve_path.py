"""Benchmark: CPU the serving path spends per streamed token, with no model cost in the way.

``met serve``'s app (real uvicorn, its own process) on the tests' scripted model (a forward that
costs next to nothing), 1 and 16 SSE streams of 256 tokens from this process; prints the server
process's CPU time (user + system, from /proc) per streamed token, the SSE events sent and the
rate.  The figure is what the event loop, the engine bridge and the engine's bookkeeping cost a
real model's step on a 2-core machine.  Compare two builds back to back (same load).  Not a test.

    python bench/bench_serve_path.py [--port 18771]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def serve(port: int) -> None:
    sys.path.insert(0, str(REPO / "tests" / "server"))
    from loguru import logger
    from server_testlib import ScriptedLM, write_tokenizer

    from metrale_core.engine import EngineConfig, LLMEngine
    from metrale_core.server import ServedModel, ServerConfig, create_app
    from metrale_core.server.runner import serve_forever
    from metrale_core.tokenizer import Tokenizer

    logger.remove()
    tok = Tokenizer.from_dir(write_tokenizer(Path(tempfile.mkdtemp())))
    config = EngineConfig(block_size=16, num_kv_blocks=1024, max_num_seqs=32, max_prefill_tokens=2048)

    def load():
        engine = LLMEngine(ScriptedLM(tok), config, tokenizer=tok)
        return ServedModel(engine=engine, tokenizer=tok, model_type="llama")

    serve_forever(create_app(ServerConfig(served_model_name="s"), load), "127.0.0.1", port, 1.0)


def main() -> None:
    import httpx

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=18771)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args.port)
    proc = subprocess.Popen([sys.executable, __file__, "--serve", "--port", str(args.port)])
    url = f"http://127.0.0.1:{args.port}"
    while True:
        try:
            if httpx.get(url + "/health").status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.2)

    def cpu() -> float:
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / 100

    async def one(client, n: int) -> int:
        body = {"model": "s", "prompt": "hello", "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True}
        events = 0
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                events += line.startswith("data: {")
        return events

    async def run() -> None:
        async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=32)) as client:
            await asyncio.gather(*(one(client, 8) for _ in range(16)))  # warm-up
            for streams in (1, 16):
                c0, t0 = cpu(), time.perf_counter()
                events = sum(await asyncio.gather(*(one(client, args.tokens) for _ in range(streams))))
                tokens = args.tokens * streams
                print(
                    f"{streams:>2} streams: server CPU {(cpu() - c0) / tokens * 1e6:.0f} us/token, "
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
