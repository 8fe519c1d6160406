"""Quality of a weight format against ``exact``, teacher-forced, next to llama.cpp's on the same file.

For each model (the embedded SmolLM2-135M Q4_1 and Qwen2.5-Coder-0.5B Q4_K_M) one fixed text
(prose and code, ``--tokens`` tokens) is fed whole; the logits of every position are compared
with those of ``--weight-format exact`` (the dequantize-to-fp32 oracle that reproduces HF
transformers):

- top-1 agreement: the fraction of positions whose argmax equals exact's;
- mean KL(exact || other) in nats over the positions.

Rows: the loader's default format (no ``--weight-format``), each of ``--formats``, and llama.cpp's
logits on the same GGUF through llama-cpp-python (``logits_all``), run in the interpreter given by
``--llama-python`` (a separate venv: ``python -m venv .venv-bench && CMAKE_ARGS=-DGGML_NATIVE=ON
.venv-bench/bin/pip install llama-cpp-python``); its version and ``system_info`` are printed.
Not a test: run by hand.

    python bench/bench_quality.py [--models smollm2,qwen] [--formats int4,bf16] [--tokens 256]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from metrale_core.activation_probe import PROBE_TEXT
from metrale_core.testing.chunked_weights import model_by_name

REPO = Path(__file__).resolve().parents[1]
#: The load-time probe's text, then more prose.
TEXT = (
    PROBE_TEXT
    + """
Water evaporates from the oceans, condenses into clouds and falls again as rain or snow. Rivers
carry it back to the sea, and the cycle begins again; along the way it shapes valleys, feeds
forests and fills the wells that towns depend on. A hash table stores values under keys: a hash
function turns each key into an index, and collisions are resolved by chaining or probing.
"""
)

_LLAMA = """
import json, sys
import numpy as np
import llama_cpp
path, out, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
ids = json.loads(sys.stdin.read())
llm = llama_cpp.Llama(model_path=path, n_ctx=len(ids) + 16, n_batch=512, n_threads=threads,
                      n_threads_batch=threads, logits_all=True, verbose=False)
llm.eval(ids)
np.save(out, np.asarray(llm.scores[:len(ids)], dtype=np.float32))
print(json.dumps({"version": llama_cpp.__version__,
                  "system_info": llama_cpp.llama_print_system_info().decode()}))
"""


def metrale_logits(path: Path, fmt: str | None, ids: list[int]) -> np.ndarray:
    from metrale_core.activation_probe import all_position_logits
    from metrale_core.components import LoadOptions
    from metrale_core.loading import load_model

    loaded = load_model(path, LoadOptions(weight_format=fmt), progress=False)
    return all_position_logits(loaded.model, ids).numpy()


def llama_logits(python: str, path: Path, ids: list[int], threads: int) -> tuple[np.ndarray, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "logits.npy"
        proc = subprocess.run(
            [python, "-c", _LLAMA, str(path), str(out), str(threads)],
            input=json.dumps(ids),
            capture_output=True,
            text=True,
            check=True,
        )
        return np.load(out), json.loads(proc.stdout.strip().splitlines()[-1])


def compare(ref: np.ndarray, other: np.ndarray) -> tuple[float, float]:
    """(top-1 agreement, mean KL(ref || other)) over the positions."""
    vocab = min(ref.shape[1], other.shape[1])  # llama.cpp may pad nothing; metrale may pad
    ref, other = ref[:, :vocab].astype(np.float64), other[:, :vocab].astype(np.float64)

    def log_softmax(x):
        x = x - x.max(axis=1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=1, keepdims=True))

    lp, lq = log_softmax(ref), log_softmax(other)
    kl = (np.exp(lp) * (lp - lq)).sum(axis=1)
    return float((ref.argmax(1) == other.argmax(1)).mean()), float(kl.mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="smollm2,qwen")
    ap.add_argument("--formats", default="", help="extra weight formats to compare (comma list)")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-python", default=str(REPO / ".venv-bench" / "bin" / "python"))
    args = ap.parse_args()

    import torch
    from loguru import logger

    from metrale_core.tokenizer import Tokenizer
    from metrale_core.weights import open_weights

    logger.remove()
    torch.set_num_threads(args.threads)
    rows = []
    info = None
    for name in args.models.split(","):
        path = model_by_name(name)
        tok = Tokenizer.from_store(open_weights(path))
        ids = tok.encode(TEXT, add_special_tokens=True)[: args.tokens]
        exact = metrale_logits(path, "exact", ids)
        candidates = [("metrale default", None)] + [(f"metrale {f}", f) for f in filter(None, args.formats.split(","))]
        for label, fmt in candidates:
            rows.append((path.name, label, *compare(exact, metrale_logits(path, fmt, ids))))
            print(rows[-1], file=sys.stderr, flush=True)
        if Path(args.llama_python).exists():
            logits, info = llama_logits(args.llama_python, path, ids, args.threads)
            rows.append((path.name, f"llama.cpp {info['version']}", *compare(exact, logits)))
        else:
            rows.append((path.name, f"llama.cpp: no {args.llama_python}", float("nan"), float("nan")))
        print(rows[-1], file=sys.stderr, flush=True)
    print(f"teacher-forced against --weight-format exact, {args.tokens} tokens max per model")
    if info is not None:
        print(f"llama-cpp-python {info['version']} system_info: {info['system_info'].strip()}")
    print(f"{'model':<42} {'format':<28} {'top-1':>7} {'mean KL':>9}")
    for model, label, top1, kl in rows:
        print(f"{model:<42} {label:<28} {top1:>7.3f} {kl:>9.4f}")


if __name__ == "__main__":
    main()
