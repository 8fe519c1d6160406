"""Test support for the ``met bench`` tests: run ``met`` in this process and read its result."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

__all__ = ["assert_sane_level", "free_port", "run_met"]


def run_met(capsys, *argv: str) -> tuple[int, str, str]:
    """``met ARGV`` through the CLI's ``main``: ``(exit code, stdout, stderr)``."""
    from metrale_core.cli.main import main

    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def read_result(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def assert_sane_level(level: dict[str, Any], requests: int, output_tokens: int) -> None:
    """Counts add up, every latency summary is ordered, times are positive: no speed asserted."""
    assert level["requests"] == requests
    assert level["completed"] == requests and level["failed"] == 0, level["errors"]
    assert level["output_tokens"] == requests * output_tokens  # ignore_eos: exactly max_tokens each
    assert level["events"] >= requests  # at least one event with text per request
    # ITL needs two events in one stream; met serve may merge a fast stream's tokens into one
    keys = ("ttft_ms", "tpot_ms", "e2e_ms") + (("itl_ms",) if level["events"] > requests else ())
    for key in keys:
        s = level[key]
        assert s["p50"] <= s["p90"] <= s["p99"], (key, s)
        assert s["mean"] >= 0, (key, s)
    assert 0 < level["ttft_ms"]["mean"] <= level["e2e_ms"]["mean"]
    assert level["duration_s"] > 0
    assert level["request_throughput"] > 0 and level["output_throughput"] > 0
