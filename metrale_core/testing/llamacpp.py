"""llama.cpp as an oracle: the tools ``scripts/build-llamacpp.sh`` builds, run on GGUF files.

Owner: the tests and benchmarks that compare against llama.cpp (the llama.cpp oracle tests of the
model plugins, ``tests/bench/test_bench_llamacpp.py``, ``bench/bench_quality.py``).

The build script puts ``llama-server``, ``llama-bench``, ``llama-quantize`` and ``met-logits``
(``scripts/llamacpp/met_logits.cpp``: one teacher-forced sequence in, the logits of every position
out) in one folder, and llama.cpp's own ``convert_hf_to_gguf.py`` with its vendored ``gguf-py`` in
``convert/`` beside them; ``.ci/run`` exports that folder as ``METRALE_LLAMACPP_BIN``.

Invariants:
- :func:`tool` looks in ``$METRALE_LLAMACPP_BIN`` (a folder, or a binary: its folder), else in the
  newest complete build under ``~/.cache/metrale-anchors/llamacpp-metrale``, else in the shared
  tool's ``~/.cache/metrale-anchors/llamacpp/bin``; a tool found nowhere is
  :func:`~metrale_core.testing.requires.missing` (a skip, a failure under ``CI=true``).
- :func:`convert_hf` runs the converter with this interpreter and the vendored ``gguf-py`` first on
  the path (the converter's own, not the installed ``gguf``); a refusal raises
  :class:`ConversionRefused` with the converter's last three error lines (the failing line and
  the error).
- :func:`compare` is the one definition of the figures: top-1 agreement and mean KL(ref || other)
  in nats over the positions, in float64, over the vocabulary both sides have.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from metrale_core.testing.requires import missing

__all__ = [
    "BIN_ENV",
    "ConversionRefused",
    "bin_dir",
    "compare",
    "convert_hf",
    "llama_logits",
    "quantize",
    "tool",
]

#: The folder of the built tools (``.ci/run`` exports what ``scripts/build-llamacpp.sh`` printed).
BIN_ENV = "METRALE_LLAMACPP_BIN"
_ANCHORS = Path.home() / ".cache" / "metrale-anchors"
_HINT = f"set {BIN_ENV} to the folder scripts/build-llamacpp.sh prints, or run it"


class ConversionRefused(RuntimeError):
    """llama.cpp's ``convert_hf_to_gguf.py`` refused a checkpoint; the message is its error."""


def bin_dir() -> Path | None:
    """The folder holding the built tools, or None where there is none."""
    env = os.environ.get(BIN_ENV)
    if env:
        where = Path(env).expanduser()
        return where.parent if where.is_file() else where
    builds = sorted(
        (p.parent for p in (_ANCHORS / "llamacpp-metrale").glob("*/complete")), key=lambda p: p.stat().st_mtime
    )
    if builds:
        return builds[-1] / "bin"
    shared = _ANCHORS / "llamacpp" / "bin"
    return shared if shared.is_dir() else None


def tool(name: str) -> Path:
    """The path of built tool ``name`` (``convert/convert_hf_to_gguf.py`` for the converter);
    :func:`missing` where it is not built."""
    where = bin_dir()
    path = where / name if where is not None else None
    if path is None or not path.is_file():
        missing(f"llama.cpp's {name} is not built (looked in {where}; {_HINT})")
    return path


def _run(cmd: list[str], *, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)


def convert_hf(checkpoint: Path, out: Path, outtype: str = "f32") -> Path:
    """``checkpoint`` (an HF folder) converted by llama.cpp's ``convert_hf_to_gguf.py`` to GGUF
    ``out`` (``outtype``: ``f32``, ``f16``, ...); :class:`ConversionRefused` with the converter's
    error where it refuses."""
    script = tool("convert/convert_hf_to_gguf.py")
    path = [str(script.parent / "gguf-py"), str(script.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    proc = _run([sys.executable, str(script), str(checkpoint), "--outfile", str(out), "--outtype", outtype], env=env)
    if proc.returncode != 0 or not out.is_file():
        lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        raise ConversionRefused(" / ".join(lines[-3:]) if lines else f"exit status {proc.returncode}")
    return out


def quantize(src: Path, dst: Path, qtype: str, threads: int = 2) -> Path:
    """GGUF ``src`` quantized by ``llama-quantize`` to ``qtype`` (``Q8_0``, ``Q4_K_M``, ...)."""
    proc = _run([str(tool("llama-quantize")), str(src), str(dst), qtype, str(threads)])
    if proc.returncode != 0:
        raise RuntimeError(f"llama-quantize {qtype} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return dst


def llama_logits(gguf: Path, ids: list[int], threads: int = 2) -> np.ndarray:
    """llama.cpp's float32 logits ``[len(ids), vocab]`` of every position of ``ids``, fed as one
    sequence from position 0 (``met-logits``)."""
    binary = tool("met-logits")
    with tempfile.TemporaryDirectory(prefix="met-logits-") as tmp:
        tokens, out = Path(tmp) / "ids.i32", Path(tmp) / "logits.f32"
        np.asarray(ids, dtype="<i4").tofile(tokens)
        proc = _run([str(binary), str(gguf), str(tokens), str(out), str(threads)])
        if proc.returncode != 0:
            raise RuntimeError(f"met-logits failed ({proc.returncode}) on {gguf.name}: {proc.stderr[-2000:]}")
        n, vocab = (int(x) for x in proc.stdout.split())
        logits = np.fromfile(out, dtype="<f4")
    assert n == len(ids) and logits.size == n * vocab, (n, vocab, logits.size)
    return logits.reshape(n, vocab)


def compare(ref: np.ndarray, other: np.ndarray) -> tuple[float, float]:
    """(top-1 agreement, mean KL(ref || other) in nats) over the rows, on the first
    ``min(vocab)`` columns (one side may pad its vocabulary)."""
    vocab = min(ref.shape[1], other.shape[1])
    p, q = np.asarray(ref)[:, :vocab].astype(np.float64), np.asarray(other)[:, :vocab].astype(np.float64)

    def log_softmax(x: np.ndarray) -> np.ndarray:
        x = x - x.max(axis=1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=1, keepdims=True))

    lp, lq = log_softmax(p), log_softmax(q)
    kl = (np.exp(lp) * (lp - lq)).sum(axis=1)
    return float((p.argmax(1) == q.argmax(1)).mean()), float(kl.mean())
