"""The command lines of ``met serve`` (and llama.cpp's ``llama-server``) as the tests and benchmarks start them.

Owner: the tests and benchmarks that run a server as a process (``testing.host_client``, the
server CLI and tensor-parallel tests, ``bench/bench_serve.py`` and the benchmarks built on it).

Invariants: ``met`` runs as ``python -m metrale_core`` under this interpreter; a server listens
on the port given (loopback) under the model name given; nothing here starts a process.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["TINY_SERVE_FLAGS", "llama_server_argv", "met_argv", "serve_args", "serve_argv"]

#: ``met serve`` flags for the tests' tiny model: a small KV pool, a short shutdown grace, one
#: thread, the checkpoint's own weights.
TINY_SERVE_FLAGS = ("--kv-cache-memory", "8M", "--shutdown-grace", "2", "--threads", "1", "--weight-format", "exact")


def met_argv(*args: str) -> list[str]:
    """``met ARGS`` under this interpreter."""
    return [sys.executable, "-m", "metrale_core", *args]


def serve_args(model: Path | str | None, port: int, name: str, *extra: str, no_tui: bool = True) -> list[str]:
    """``serve [MODEL] --port PORT [--no-tui] --served-model-name NAME EXTRA``, the arguments of
    ``met`` (no ``MODEL``: the flags in ``extra`` name it)."""
    head = ["serve", *([str(model)] if model is not None else []), "--port", str(port)]
    return [*head, *(["--no-tui"] if no_tui else []), "--served-model-name", name, *extra]


def serve_argv(model: Path | str | None, port: int, name: str, *extra: str, no_tui: bool = True) -> list[str]:
    """:func:`serve_args` as a process's command line."""
    return met_argv(*serve_args(model, port, name, *extra, no_tui=no_tui))


def llama_server_argv(
    binary: Path | str, model: Path, threads: int, slots: int, ctx_per_slot: int, port: int
) -> list[str]:
    """llama.cpp's ``llama-server`` on ``model``: ``threads`` threads (generation and batch),
    ``slots`` parallel slots of ``ctx_per_slot`` tokens each, on ``127.0.0.1:port``."""
    return [
        str(binary),
        "-m",
        str(model),
        "-t",
        str(threads),
        "-tb",
        str(threads),
        "-np",
        str(slots),
        "-c",
        str(ctx_per_slot * slots),
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
    ]
