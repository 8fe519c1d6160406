"""CPU benchmark: Metrale (per weight format) vs HF transformers vs llama.cpp, ratios from one run.

Measures, on the embedded SmolLM2-135M-Instruct Q4_1 GGUF with greedy decoding and ``--threads``:
single-stream decode tok/s, prefill tok/s of a 512-token prompt, and the aggregate decode tok/s of
``--streams`` concurrent streams (in-process ``LLMEngine`` by default; with ``--http`` over HTTP
against ``met serve`` and llama.cpp's server, see below).  Not a test: run by hand.

llama-cpp-python is never a dependency of the project: install it in a separate environment
(``python -m venv .venv-bench && .venv-bench/bin/pip install 'llama-cpp-python[server]'``) and
point ``--llama-python`` at that interpreter.  For the N-stream HTTP figure the fair baseline is
llama.cpp's own ``llama-server`` with N parallel slots (llama-cpp-python's server runs one request
at a time): build it from the sources vendored in the llama-cpp-python sdist
(``cmake -B build -DLLAMA_BUILD_SERVER=ON && cmake --build build --target llama-server``) and pass
``--llama-server PATH`` (default: ``.venv-bench/bin/llama-server`` when present).

    python bench/bench_cpu.py [--formats auto,int4] [--threads 2] [--http] [--no-hf] [--no-llama]

Notes: HF decode rates are (generate(n) - generate(1)) / (n - 1), i.e. prefill excluded;
llama-cpp-python's server runs one request at a time, so its "aggregate" is its serial rate.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench_args import int_flags  # same folder
from bench_generate import engine_rate, hf_rate  # the one in-process timing loops (same folder)

from metrale_core.testing.serve_argv import llama_server_argv

REPO = Path(__file__).resolve().parents[1]
PROMPT = "Once upon a time"

_LLAMA_SCRIPT = textwrap.dedent("""
    import json, sys, time
    from llama_cpp import Llama
    path, threads, n, short, long_ids = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \\
        json.loads(sys.argv[4]), json.loads(sys.argv[5])
    llm = Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=2048,
                n_batch=512, verbose=False)
    def gen(ids, k):
        llm.reset()
        t = time.perf_counter()
        out = llm.create_completion(ids, max_tokens=k, temperature=0.0, logit_bias={2: -1e9})
        return time.perf_counter() - t, out["usage"]["completion_tokens"]
    gen(short, 4)  # warm-up
    t1, _ = gen(short, 1)
    tn, k = gen(short, n)
    tp, _ = gen(long_ids, 1)
    print(json.dumps({"decode1": (k - 1) / (tn - t1), "prefill": len(long_ids) / tp}))
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- Metrale -----------------------------------------------------------------------------------


def _metrale(fmt: str, dtype: str, short, long_ids, args) -> dict:
    from metrale_core.loading.load import load_model
    from metrale_core.plugin.components import LoadOptions

    os.environ["METRALE_WEIGHT_FORMAT"] = fmt
    model = load_model(args.model, LoadOptions(dtype=dtype), progress=False).model
    engine_rate(model, short, 1, 4)  # warm-up
    row = {
        "decode1": engine_rate(model, short, 1, args.decode_tokens),
        "prefill": engine_rate(model, long_ids, 1, 1, prefill_only=True),
    }
    if not args.http:
        row["decodeN"] = engine_rate(model, short, args.streams, args.decode_tokens)
    return row


# --- HF transformers -----------------------------------------------------------------------------


def _hf(path: Path, short, long_ids, args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()

    hf_rate(model, short, 1, 4)  # warm-up
    prefill = hf_rate(model, long_ids, 1, 0, prefill_only=True)
    decode1 = hf_rate(model, short, 1, args.decode_tokens)
    return {"decode1": decode1, "prefill": prefill, "decodeN": hf_rate(model, short, args.streams, args.decode_tokens)}


# --- over HTTP -------------------------------------------------------------------------------------


def _http_aggregate(port: int, model_name: str | None, prompt: str, streams: int, n: int) -> float:
    import httpx

    body = {"prompt": prompt, "max_tokens": n, "temperature": 0.0, "logit_bias": {"2": -100}}
    if model_name is not None:  # met serve (llama-cpp-python's server rejects unknown fields)
        body.update(model=model_name, ignore_eos=True)

    # one pooled client with a connection per stream, opened by the warm-up round, so the timed
    # round measures the server rather than the client's connection set-up
    with httpx.Client(timeout=600, limits=httpx.Limits(max_connections=streams)) as client:

        def one(_):
            r = client.post(f"http://127.0.0.1:{port}/v1/completions", json=body)
            r.raise_for_status()
            return r.json()["usage"]["completion_tokens"]

        with ThreadPoolExecutor(streams) as pool:
            list(pool.map(one, range(streams)))  # warm-up
            t0 = time.perf_counter()
            tokens = sum(pool.map(one, range(streams)))
            return tokens / (time.perf_counter() - t0)


def _serve(cmd: list[str], env: dict, port: int) -> subprocess.Popen:
    import httpx

    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {' '.join(cmd)}")
        try:  # ready: /health says 200 (met serve: 503 while loading), else /v1/models answers
            health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code
            if health == 200 or (
                health == 404 and httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200
            ):
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.terminate()
    raise RuntimeError(f"server did not come up: {' '.join(cmd)}")


def _metrale_http(fmt: str, dtype: str, path: Path, prompt: str, args) -> float:
    port = _free_port()
    env = {**os.environ, "METRALE_WEIGHT_FORMAT": fmt, "OMP_NUM_THREADS": str(args.threads)}
    cmd = [
        sys.executable,
        "-m",
        "metrale_core.cli.main",
        "serve",
        str(path),
        "--port",
        str(port),
        "--no-tui",
        "--dtype",
        dtype,
        "--served-model-name",
        "bench",
        "--max-num-seqs",
        str(max(16, args.streams)),
    ]
    proc = _serve(cmd, env, port)
    try:
        return _http_aggregate(port, "bench", prompt, args.streams, args.decode_tokens)
    finally:
        proc.terminate()
        proc.wait(30)


def _llama_http(path: Path, prompt: str, args) -> float:
    port = _free_port()
    if args.llama_server and Path(args.llama_server).exists():  # llama.cpp, N parallel slots
        cmd = llama_server_argv(args.llama_server, path, args.threads, args.streams, 1024, port)
    else:  # llama-cpp-python's server: one request at a time
        cmd = [
            args.llama_python,
            "-m",
            "llama_cpp.server",
            "--model",
            str(path),
            "--n_threads",
            str(args.threads),
            "--n_ctx",
            "4096",
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
        ]
    proc = _serve(cmd, dict(os.environ), port)
    try:
        return _http_aggregate(port, None, prompt, args.streams, args.decode_tokens)
    finally:
        proc.terminate()
        proc.wait(30)


def _llama(path: Path, short, long_ids, args) -> dict:
    out = subprocess.run(
        [
            args.llama_python,
            "-c",
            _LLAMA_SCRIPT,
            str(path),
            str(args.threads),
            str(args.decode_tokens),
            json.dumps(short),
            json.dumps(long_ids),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- main ------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF file (default: the embedded SmolLM2)")
    int_flags(ap, threads=2, decode_tokens=64, streams=16, prefill_tokens=512)
    ap.add_argument(
        "--formats",
        default="auto",
        help="comma list of weight formats, each optionally :bfloat16 for bf16 activations "
        "(default: auto, what met serve runs with no flag)",
    )
    ap.add_argument(
        "--http", action="store_true", help="N-stream aggregate over HTTP (met serve vs llama-cpp-python's server)"
    )
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--llama-python", default=str(REPO / ".venv-bench" / "bin" / "python"))
    ap.add_argument(
        "--llama-server",
        default=str(REPO / ".venv-bench" / "bin" / "llama-server"),
        help="llama.cpp's llama-server binary for the N-stream HTTP baseline",
    )
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from metrale_core.loading.load import resolve_model_path
    from metrale_core.text.tokenizer import Tokenizer
    from metrale_core.weights import open_weights

    path = resolve_model_path(args.model, progress=False)
    args.model = path
    tok = Tokenizer.from_store(open_weights(path))
    short = tok.encode(PROMPT)
    long_ids = (tok.encode("The quick brown fox jumps over the lazy dog. ") * 200)[: args.prefill_tokens]

    rows: dict[str, dict] = {}
    for spec in args.formats.split(","):
        fmt, _, act = spec.partition(":")
        name = f"metrale {spec}"
        rows[name] = _metrale(fmt, act or "float32", short, long_ids, args)
        if args.http:
            rows[name]["decodeN"] = _metrale_http(fmt, act or "float32", path, PROMPT, args)
        print(name, rows[name], file=sys.stderr, flush=True)
    if not args.no_hf:
        rows["hf-transformers fp32"] = _hf(path, short, long_ids, args)
    if not args.no_llama and Path(args.llama_python).exists():
        rows["llama-cpp-python"] = _llama(path, short, long_ids, args)
        rows["llama-cpp-python"]["decodeN"] = _llama_http(path, PROMPT, args) if args.http else float("nan")
        if args.http and Path(args.llama_server).exists():
            print(f"(llama decode{args.streams} is llama-server with {args.streams} parallel slots)")

    where = "over HTTP" if args.http else "in-process"
    print(
        f"{path.name}, {args.threads} threads, greedy, {args.decode_tokens} new tokens, load {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'engine':<24} {'decode 1':>10} {f'prefill {len(long_ids)}':>12} "
        f"{f'decode {args.streams}x agg ({where})':>28}"
    )
    for name, r in rows.items():
        print(f"{name:<24} {r['decode1']:>10.1f} {r['prefill']:>12.1f} {r.get('decodeN', float('nan')):>28.1f}")
    refs = [n for n in ("hf-transformers fp32", "llama-cpp-python") if n in rows]
    for name, r in rows.items():
        if not name.startswith("metrale"):
            continue
        for ref in refs:
            b = rows[ref]
            print(
                f"{name} / {ref}: decode1 {r['decode1'] / b['decode1']:.2f}x, prefill "
                f"{r['prefill'] / b['prefill']:.2f}x, decode{args.streams} "
                f"{r.get('decodeN', float('nan')) / b.get('decodeN', float('nan')):.2f}x"
            )


if __name__ == "__main__":
    main()
