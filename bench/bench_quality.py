"""Quality of a weight format against ``exact``, teacher-forced, next to llama.cpp's on the same file.

For each model (the embedded SmolLM2-135M Q4_1 and Qwen2.5-Coder-0.5B Q4_K_M) one fixed text
(prose and code, ``--tokens`` tokens) is fed whole; the logits of every position are compared
with those of ``--weight-format exact`` (the dequantize-to-fp32 oracle that reproduces HF
transformers):

- top-1 agreement: the fraction of positions whose argmax equals exact's;
- mean KL(exact || other) in nats over the positions.

Rows: the loader's default format (no ``--weight-format``), each of ``--formats``, and llama.cpp's
logits on the same GGUF through ``met-logits`` of the natively built llama.cpp
(``scripts/build-llamacpp.sh``; ``$METRALE_LLAMACPP_BIN`` or its newest build).  The figures are
``metrale_core.testing.llamacpp.compare``'s, as in the llama.cpp oracle tests.  Not a test: run
by hand.

    python bench/bench_quality.py [--models smollm2,qwen] [--formats int4,bf16] [--tokens 256]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from bench_args import int_flags  # same folder

from metrale_core.loading.activation_probe import PROBE_TEXT
from metrale_core.testing.chunked_weights import model_by_name
from metrale_core.testing.llamacpp import bin_dir, compare, llama_logits

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


def metrale_logits(path: Path, fmt: str | None, ids: list[int]) -> np.ndarray:
    from metrale_core.loading.activation_probe import all_position_logits
    from metrale_core.loading.load import load_model
    from metrale_core.plugin.components import LoadOptions

    loaded = load_model(path, LoadOptions(weight_format=fmt), progress=False)
    return all_position_logits(loaded.model, ids).numpy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="smollm2,qwen")
    ap.add_argument("--formats", default="", help="extra weight formats to compare (comma list)")
    int_flags(ap, tokens=256, threads=2)
    args = ap.parse_args()

    import torch
    from loguru import logger

    from metrale_core.text.tokenizer import Tokenizer
    from metrale_core.weights import open_weights

    logger.remove()
    torch.set_num_threads(args.threads)
    rows = []
    where = bin_dir()
    llama = where / "met-logits" if where is not None and (where / "met-logits").is_file() else None
    for name in args.models.split(","):
        path = model_by_name(name)
        tok = Tokenizer.from_store(open_weights(path))
        ids = tok.encode(TEXT, add_special_tokens=True)[: args.tokens]
        exact = metrale_logits(path, "exact", ids)
        candidates = [("metrale default", None)] + [(f"metrale {f}", f) for f in filter(None, args.formats.split(","))]
        for label, fmt in candidates:
            rows.append((path.name, label, *compare(exact, metrale_logits(path, fmt, ids))))
            print(rows[-1], file=sys.stderr, flush=True)
        if llama is not None:
            rows.append((path.name, "llama.cpp (met-logits)", *compare(exact, llama_logits(path, ids, args.threads))))
        else:
            rows.append((path.name, "llama.cpp: met-logits not built", float("nan"), float("nan")))
        print(rows[-1], file=sys.stderr, flush=True)
    print(f"teacher-forced against --weight-format exact, {args.tokens} tokens max per model")
    if llama is not None:
        print(f"llama.cpp: {llama}")
    print(f"{'model':<42} {'format':<28} {'top-1':>7} {'mean KL':>9}")
    for model, label, top1, kl in rows:
        print(f"{model:<42} {label:<28} {top1:>7.3f} {kl:>9.4f}")


if __name__ == "__main__":
    main()
