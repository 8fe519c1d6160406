"""Benchmark: the new families (issue 31) on random GGUFs of real shapes, Metrale against llama.cpp.

For each shape of ``random_gguf.SHAPES`` (a random-weight Q4_K_M file written once into
``--dir``), in one run, default flags, ``--threads`` threads:

- engine against engine: ``llama-bench -p P -n N`` (ppP, tgN) and ``met bench engine`` (ppP, tgN
  and, for an MoE, tgN@b``--streams``) in a subprocess each, alternating per repetition;
- for an MoE, ``--streams`` concurrent streams over HTTP as well: ``met serve`` and
  ``llama-server -np STREAMS`` driven by ``met bench serve``'s client (aggregate output tok/s);
- the peak RSS of ``met bench engine`` (``wait4``'s ``ru_maxrss``) against the file's size;
- ik_llama.cpp's ``llama-bench`` figures, where built, as the stretch anchor.

The CPU's flags are printed first.  Not a test: run by hand on a quiet machine.

    python bench/bench_families.py [--shapes phi3-4b,gemma2-2b,...] [--moe-layers 48] [--reps 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_args import int_flags  # same folder
from bench_serve import ANCHORS, llama_server, met_serve  # same folder
from random_gguf import SHAPES, Shape, write

NAN = float("nan")


def cpu_flags() -> str:
    """The model name and the SIMD flags that matter here (/proc/cpuinfo)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    simd = [f for f in flags if f.startswith(("avx", "amx", "fma", "f16c"))]
    return f"{name} ({platform.machine()}, {os.cpu_count()} cpus): {' '.join(simd)}"


def _run_measured(cmd: list[str], env: dict[str, str] | None = None) -> tuple[str, float]:
    """Run ``cmd``; its stdout and its peak RSS in MB (``wait4``)."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{text[-2000:]}")
    return text, usage.ru_maxrss / 1024


def llama_bench(binary: Path, path: Path, args) -> dict[str, float]:
    text, _ = _run_measured(
        [str(binary), "-m", str(path), "-t", str(args.threads), "-p", str(args.prompt), "-n", str(args.gen),
         "-r", "1", "-o", "json"]
    )  # fmt: skip
    return {("pp" if row.get("n_prompt") else "tg"): row["avg_ts"] for row in json.loads(text)}


def met_bench(path: Path, args, moe: bool) -> tuple[dict[str, float], float]:
    batches = f"1,{args.streams}" if moe else "1"
    cmd = [sys.executable, "-m", "metrale_core", "bench", "engine", str(path), "-p", str(args.prompt),
           "-n", str(args.gen), "-r", "1", "--batch", batches, "-o", "json",
           "--threads", str(args.threads)]  # fmt: skip
    text, rss = _run_measured(cmd, {**os.environ, "OMP_NUM_THREADS": str(args.threads)})
    rows = json.loads(text[text.index("{") :])["tests"]
    res: dict[str, float] = {}
    for row in rows:
        test = row["test"]
        key = "pp" if test.startswith("pp") else ("tg" if "@b" not in test else "tg_streams")
        res[key] = row["tokens_per_s"]
    return res, rss


def http_streams(server: Any, args) -> float:
    """Aggregate output tok/s of ``--streams`` concurrent streams against ``server``."""
    from metrale_core.bench.serve import ServeBenchConfig, run_serve_bench

    result = run_serve_bench(
        ServeBenchConfig(
            url=server.url,
            concurrency=[args.streams],
            prompt_tokens=32,
            output_tokens=args.gen,
            num_prompts=args.streams,
            progress=False,
        )
    )
    return float(result["levels"][0]["output_throughput"])


def _median(values: list[float]) -> float:
    values = sorted(v for v in values if v == v)
    return values[len(values) // 2] if values else NAN


def _streams_then_stop(server, args) -> float:
    """:func:`http_streams` of a started server, which is stopped after it however it ends."""
    try:
        return http_streams(server, args)
    finally:
        server.stop()


def bench_shape(name: str, args) -> dict[str, Any]:
    shape = SHAPES[name]
    layers = args.moe_layers if shape.experts else args.layers
    if layers:
        shape = Shape(**{**shape.__dict__, "layers": layers})
    from metrale_core.testing.chunked_weights import model_by_name

    path = write(shape, args.dir / f"{name}-{shape.layers}l.gguf", model_by_name("qwen"))
    row: dict[str, Any] = {"shape": name, "layers": shape.layers, "file_mb": path.stat().st_size / 2**20}
    print(f"[{name}] {path} ({row['file_mb']:.0f} MB)", file=sys.stderr, flush=True)
    llama = args.llamacpp_bin / "llama-bench"
    runs: dict[str, list[float]] = {}
    rss = []
    for rep in range(args.reps):
        got, peak = met_bench(path, args, bool(shape.experts))
        rss.append(peak)
        for key, value in got.items():
            runs.setdefault(f"met_{key}", []).append(value)
        if llama.exists():
            for key, value in llama_bench(llama, path, args).items():
                runs.setdefault(f"llama_{key}", []).append(value)
        print(f"[{name}] rep {rep}: { ({k: round(v[-1], 2) for k, v in runs.items()}) }", file=sys.stderr, flush=True)
    row.update({key: _median(values) for key, values in runs.items()})
    row["met_peak_rss_mb"] = max(rss)
    if shape.experts:
        flags = argparse.Namespace(met_flags="", threads=args.threads, streams=args.streams)
        with tempfile.TemporaryDirectory() as logs:
            row["met_http_streams"] = _streams_then_stop(met_serve(path, flags, Path(logs) / "met.log"), args)
            server = args.llamacpp_bin / "llama-server"
            if server.exists():
                srv = llama_server(server, path, flags, Path(logs) / "llama.log")
                row["llama_http_streams"] = _streams_then_stop(srv, args)
    ik = args.ik_bin / "llama-bench"
    if ik.exists():
        row.update({f"ik_{k}": v for k, v in llama_bench(ik, path, args).items()})
    return row


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b == b and b and a == a else "n/a"


def report(rows: list[dict[str, Any]], args) -> None:
    print(f"\nCPU: {cpu_flags()}; threads {args.threads}; pp{args.prompt}, tg{args.gen}, medians of {args.reps}")
    head = (
        f"{'shape':<20} {'MB':>7} {'met pp':>8} {'llama pp':>8} {'ratio':>6} {'met tg':>7} {'llama tg':>8} {'ratio':>6}"
    )
    print(head + f" {'vs ik pp/tg':>12} {'RSS MB':>7}")
    for r in rows:
        ik = f"{_ratio(r['met_pp'], r.get('ik_pp', NAN))}/{_ratio(r['met_tg'], r.get('ik_tg', NAN))}"
        print(
            f"{r['shape']:<20} {r['file_mb']:>7.0f} {r['met_pp']:>8.1f} {r.get('llama_pp', NAN):>8.1f} "
            f"{_ratio(r['met_pp'], r.get('llama_pp', NAN)):>6} {r['met_tg']:>7.2f} {r.get('llama_tg', NAN):>8.2f} "
            f"{_ratio(r['met_tg'], r.get('llama_tg', NAN)):>6} {ik:>12} {r['met_peak_rss_mb']:>7.0f}"
        )
        if "met_http_streams" in r:
            print(
                f"{'':<20} {args.streams} streams: met engine {r.get('met_tg_streams', NAN):.2f}, "
                f"met serve {r['met_http_streams']:.2f}, llama-server -np {args.streams} "
                f"{r.get('llama_http_streams', NAN):.2f} tok/s "
                f"({_ratio(r['met_http_streams'], r.get('llama_http_streams', NAN))})"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of {', '.join(SHAPES)}")
    ap.add_argument("--layers", type=int, default=0, help="layers of the dense shapes (0: the real count)")
    ap.add_argument("--moe-layers", type=int, default=0, help="layers of the MoE shapes (0: the real count)")
    ap.add_argument("--dir", type=Path, default=Path.home() / ".cache" / "metrale-bench")
    int_flags(ap, threads=2, prompt=512, gen=32, streams=8, reps=2)
    ap.add_argument(
        "--llamacpp-bin", type=Path, default=Path(os.environ.get("METRALE_LLAMACPP_BIN", ANCHORS / "llamacpp" / "bin"))
    )
    ap.add_argument("--ik-bin", type=Path, default=ANCHORS / "ik-llamacpp" / "bin")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    print(f"CPU: {cpu_flags()}", file=sys.stderr, flush=True)
    rows = [bench_shape(name, args) for name in args.shapes.split(",")]
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    report(rows, args)


if __name__ == "__main__":
    main()
