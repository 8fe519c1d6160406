"""What ``met bench`` prints and writes: the stdout tables, the JSON result file, the machine line.

Owner: ``metrale_core.cli.bench_cmd``.

Invariants:
- The tables are plain text, one row per concurrency level (``serve``) or per test (``engine``);
  NaN prints as ``-``.
- :func:`write_json` writes strict JSON: NaN and infinities become ``null``.
"""

from __future__ import annotations

import json
import math
import os
import platform
from pathlib import Path
from typing import Any

__all__ = ["engine_table", "machine_info", "serve_table", "to_json", "write_json"]

#: CPU features worth naming next to a figure (those the kernels and llama.cpp pick variants by).
_FEATURES = ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "neon", "asimd")


def machine_info() -> dict[str, Any]:
    """The client machine: CPU model, cores, the CPU features that matter, OS, Python, met."""
    import metrale_core
    from metrale_core.kernels.cpu import cpu_flags

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = cpu_flags()
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "cpu_features": [f for f in _FEATURES if f in flags],
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "os": platform.platform(),
        "python": platform.python_version(),
        "metrale": metrale_core.__version__,
    }


def machine_line(info: dict[str, Any]) -> str:
    features = "+".join(info["cpu_features"]) or "none of " + ",".join(_FEATURES[:5])
    return f"{info['cpu']}, {info['cores']} cores ({features}), load {info['load_avg_1m']:.2f}, met {info['metrale']}"


def _cell(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _table(header: list[str], rows: list[list[str]], left: int = 0) -> str:
    """Columns right-aligned (the first ``left`` columns left-aligned), widths to fit."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)])


_SERVE_COLUMNS = (
    ("ttft_ms", "mean", "TTFT mean"),
    ("ttft_ms", "p50", "p50"),
    ("ttft_ms", "p90", "p90"),
    ("ttft_ms", "p99", "p99"),
    ("tpot_ms", "p50", "TPOT p50"),
    ("itl_ms", "mean", "ITL mean"),
    ("itl_ms", "p50", "p50"),
    ("itl_ms", "p99", "p99"),
    ("e2e_ms", "mean", "E2E mean"),
    ("e2e_ms", "p50", "p50"),
    ("e2e_ms", "p99", "p99"),
)


def serve_table(result: dict[str, Any]) -> str:
    """``met bench serve``'s table (latencies in ms) and the lines that say how it was measured."""
    cfg = result["config"]
    header = ["conc", "ok", "fail", "req/s", "out tok/s", "total tok/s", *(c[2] for c in _SERVE_COLUMNS)]
    rows = []
    for lv in result["levels"]:
        rows.append(
            [
                str(lv["concurrency"]),
                str(lv["completed"]),
                str(lv["failed"]),
                _cell(lv["request_throughput"], 2),
                _cell(lv["output_throughput"]),
                _cell(lv["total_token_throughput"]),
                *(_cell(lv[key][stat]) for key, stat, _ in _SERVE_COLUMNS),
            ]
        )
    per_event = [lv["tokens_per_event"] for lv in result["levels"] if lv["completed"]]
    sources = sorted({lv["output_tokens_from"] for lv in result["levels"] if lv["output_tokens_from"]})
    lines = [
        f"{cfg['url']}  model {cfg['model']}  /v1/{'chat/completions' if cfg['endpoint'] == 'chat' else 'completions'}"
        f"  prompt {cfg['prompt_tokens']} tokens ({result['prompts']['how']}), output {cfg['output_tokens']} tokens"
        " (ignore_eos, greedy)",
        _table(header, rows),
        "times in ms; TTFT and E2E from the request sent; TPOT per output token ((E2E - TTFT) / (tokens - 1)); "
        "ITL per SSE event with text (vLLM's definition) -- "
        + (
            "tokens per event " + "/".join(_cell(t, 2) for t in per_event) + " (a server may merge tokens into one "
            "event: met serve does every --stream-interval-ms, 20 ms by default)"
            if per_event
            else "no event came"
        ),
        f"output tokens counted from: {', '.join(sources) or '-'}; client: {machine_line(result['machine'])}",
    ]
    for lv in result["levels"]:
        for error in lv["errors"]:
            lines.append(f"concurrency {lv['concurrency']}: failed request: {error}")
    return "\n".join(lines)


def engine_table(result: dict[str, Any]) -> str:
    """``met bench engine``'s llama-bench-like table: one row per test, t/s mean +- sd."""
    header = ["model", "format", "threads", "test", "t/s"]
    rows = [
        [
            result["model"],
            result["format"],
            str(result["threads"]),
            t["test"],
            f"{_cell(t['tokens_per_s'], 2)} ± {_cell(t['tokens_per_s_sd'], 2)}",
        ]
        for t in result["tests"]
    ]
    note = (
        f"{result['reps']} repetitions after a warm-up; pp = one prompt prefilled, tg = tokens generated "
        f"greedy after a {result['decode_prompt_tokens']}-token prompt (ignore_eos), @bN = N sequences at once "
        f"(aggregate t/s); {machine_line(result['machine'])}"
    )
    return _table(header, rows, left=2) + "\n" + note


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def to_json(result: dict[str, Any]) -> str:
    return json.dumps(_clean(result), indent=2, allow_nan=False)


def write_json(path: str | Path, result: dict[str, Any]) -> None:
    Path(path).write_text(to_json(result) + "\n")
