"""Benchmark: decode and prefill at context depth (issue 35), met in-process against llama.cpp.

For each depth of ``--depths`` (default 512, 2k, 4k, 8k tokens), one stream, greedy, ``ignore_eos``,
``--threads`` threads, the same GGUF (``--model``: the embedded default model, ``qwen``, or a path):

- met in-process: an ``LLMEngine`` built from ``met serve``'s default flags (plus ``--met-flags``)
  gets a fresh prompt of exactly ``depth`` tokens (its first tokens differ per depth and
  repetition, so no prefix-cache block is ever reused): prefill tok/s is ``depth`` over the time to
  the first token, decode tok/s the ``--decode-tokens`` that follow, first to last token, so every
  one of them attends over at least ``depth`` positions;
- llama.cpp's ``llama-bench`` (``$METRALE_LLAMACPP_BIN``, else the newest
  ``scripts/build-llamacpp.sh`` build) on the same file and threads: ``-p DEPTH -n 0`` (prefill of
  the whole prompt) and ``-p 0 -n N -d DEPTH`` (decode at depth); ik_llama.cpp's as well where
  built (``--ik-bin``).  A missing anchor prints "not built".

A depth the engine's context cannot hold with the decode tokens (SmolLM2: 8192 positions) is
clipped to ``max_model_len - decode_tokens`` for every engine alike, and the table says so.  met and
the anchors take turns within each repetition (``--reps``, medians reported).  The CPU's flags are
printed first.  Not a test: run by hand on a quiet machine.

    python bench/bench_long_context.py [--model smollm2|qwen|PATH] [--depths 512,2048,4096,8192]
                                       [--decode-tokens 64] [--threads 2] [--reps 2]
                                       [--met-flags "--max-model-len 32768 --kv-cache-memory 2G"]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_args import int_flags  # same folder
from bench_families import cpu_flags  # same folder
from bench_serve import ANCHORS, FILLER, InProcess

from metrale_core.testing.chunked_weights import model_by_name

NAN = float("nan")


def prompt_ids(tok: Any, depth: int, tag: str) -> list[int]:
    """Exactly ``depth`` token ids: ``tag`` (unique per depth and repetition) then filler text."""
    text = f"{tag} {time.time()} " + FILLER
    ids = tok.encode(text)
    while len(ids) < depth:
        text += FILLER * max(1, (depth - len(ids)) // 16)
        ids = tok.encode(text)
    return ids[:depth]


class Met:
    """met in-process: one engine for the whole run, a fresh prompt per measurement."""

    def __init__(self, path: Path, args) -> None:
        flags = argparse.Namespace(met_flags=args.met_flags, streams=1)
        self.inproc = InProcess(path, "", flags)
        self.max_model_len = self.inproc.engine.max_model_len
        self.args = args

    def measure(self, depth: int, rep: int) -> dict[str, float]:
        ids = prompt_ids(self.inproc.tok, depth, f"depth {depth} rep {rep}:")
        t0, first, last, produced = self.inproc._run([ids], self.args.decode_tokens)
        return {"pp": depth / (first - t0), "tg": (produced - 1) / (last - first) if produced > 1 else NAN}


def llama_bench(binary: Path, path: Path, depth: int, args) -> dict[str, float]:
    """``llama-bench``'s prefill of ``depth`` tokens and decode of ``--decode-tokens`` at ``depth``."""
    res: dict[str, float] = {}
    for key, sizes in (("pp", ["-p", str(depth), "-n", "0"]), ("tg", ["-p", "0", "-n", str(args.decode_tokens)])):
        depth_args = ["-d", str(depth)] if key == "tg" else []
        cmd = [str(binary), "-m", str(path), "-t", str(args.threads), *sizes, *depth_args, "-r", "1", "-o", "json"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"  {' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-500:]}", file=sys.stderr)
            res[key] = NAN
            continue
        res[key] = float(json.loads(proc.stdout)[0]["avg_ts"])
    return res


def anchors(args) -> dict[str, Path | None]:
    """The ``llama-bench`` binaries to run, by label (None: not built)."""
    from metrale_core.testing.llamacpp import bin_dir

    found = {}
    for label, folder in (("llama.cpp", args.llamacpp_bin or bin_dir()), ("ik_llama.cpp", args.ik_bin)):
        binary = folder / "llama-bench" if folder is not None else None
        found[label] = binary if binary is not None and binary.is_file() else None
    return found


def run(args) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    path = model_by_name(args.model)
    met = Met(path, args)
    met.measure(64, -1)  # warm-up: kernels built, first-call costs paid
    benches = anchors(args)
    depths = []
    for depth in (int(d) for d in args.depths.split(",")):
        usable = min(depth, met.max_model_len - args.decode_tokens)
        if usable < 1:
            raise SystemExit(f"max_model_len {met.max_model_len} leaves no room for {args.decode_tokens} tokens")
        depths.append((depth, usable))
    runs: dict[tuple[int, str], list[float]] = {}
    for rep in range(args.reps):
        for depth, usable in depths:
            got = {"met": met.measure(usable, rep)}
            for label, binary in benches.items():
                if binary is not None:
                    got[label] = llama_bench(binary, path, usable, args)
            for engine, figures in got.items():
                for key, value in figures.items():
                    runs.setdefault((depth, f"{engine} {key}"), []).append(value)
            shown = "; ".join(f"{e} pp {f['pp']:.1f} tg {f['tg']:.1f}" for e, f in got.items())
            print(f"  rep {rep + 1} depth {usable}: {shown}", file=sys.stderr, flush=True)
    medians = {f"{depth}|{name}": statistics.median(values) for (depth, name), values in runs.items()}
    return {
        "model": path.name,
        "depths": depths,
        "max_model_len": met.max_model_len,
        "anchors": {k: str(v) if v else None for k, v in benches.items()},
        "figures": medians,
    }


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b == b and b and a == a else "n/a"


def report(result: dict[str, Any], args) -> None:
    from metrale_core.kernels.cpu import selected_isa

    isa, why = selected_isa()
    fig = result["figures"]
    print(f"\nCPU: {cpu_flags()}")
    print(
        f"{result['model']}: {args.threads} threads, one stream, greedy, {args.decode_tokens} decode tokens, "
        f"median of {args.reps}; met flags: {args.met_flags or '(default)'}; met C kernels: "
        f"{isa or 'torch (no C)'} ({why}); load avg {os.getloadavg()[0]:.2f}"
    )
    for label, binary in result["anchors"].items():
        print(f"{label} llama-bench: {binary or 'not built'}")
    built = [label for label, binary in result["anchors"].items() if binary]
    head = f"{'depth':>14} {'met pp':>8} {'met tg':>7}"
    for label in built:
        head += f" {label + ' pp':>15} {label + ' tg':>15} {'pp ratio':>8} {'tg ratio':>8}"
    print(head)
    for depth, usable in result["depths"]:
        shown = f"{usable}" + (f" (of {depth})" if usable != depth else "")
        met_pp, met_tg = fig[f"{depth}|met pp"], fig[f"{depth}|met tg"]
        line = f"{shown:>14} {met_pp:>8.1f} {met_tg:>7.2f}"
        for label in built:
            pp, tg = fig[f"{depth}|{label} pp"], fig[f"{depth}|{label} tg"]
            line += f" {pp:>15.1f} {tg:>15.2f} {_ratio(met_pp, pp):>8} {_ratio(met_tg, tg):>8}"
        print(line)
    (first, _), (last, last_usable) = result["depths"][0], result["depths"][-1]
    kept = [f"met {_ratio(fig[f'{last}|met tg'], fig[f'{first}|met tg'])}"]
    kept += [f"{label} {_ratio(fig[f'{last}|{label} tg'], fig[f'{first}|{label} tg'])}" for label in built]
    print(f"decode at {last_usable} / decode at {result['depths'][0][1]}: " + ", ".join(kept))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="smollm2 (the embedded default), qwen, or a GGUF path")
    ap.add_argument("--depths", default="512,2048,4096,8192", help="comma list of context depths in tokens")
    int_flags(ap, decode_tokens=64, threads=2)
    ap.add_argument("--reps", type=int, default=2, help="repetitions per figure (median)")
    ap.add_argument("--met-flags", default="", help="extra met serve flags (default: none)")
    env_bin = os.environ.get("METRALE_LLAMACPP_BIN")
    ap.add_argument(
        "--llamacpp-bin",
        type=Path,
        default=Path(env_bin) if env_bin else None,
        help="llama.cpp's bin folder (default: $METRALE_LLAMACPP_BIN, else the newest scripts/build-llamacpp.sh build)",
    )
    ap.add_argument("--ik-bin", type=Path, default=ANCHORS / "ik-llamacpp" / "bin")
    ap.add_argument("--json", type=Path, default=None, help="also write the raw figures here")
    args = ap.parse_args()
    if args.decode_tokens < 2:
        raise SystemExit("--decode-tokens must be at least 2 (decode speed is first to last token)")

    from loguru import logger

    logger.remove()
    print(f"CPU: {cpu_flags()}", file=sys.stderr, flush=True)
    result = run(args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    report(result, args)


if __name__ == "__main__":
    main()
