"""The activation precision of a GGUF model's block kernels, measured once at load.

Owner: ``metrale_core.loading.load.load_model`` calls :func:`choose_activation_precision` once per
model it loads, before the model serves anything.

The GGUF kernels (``layers.gguf_linear``) quantize activations per block of 32 either to 15 bits
(``255 * hi + lo``: two int8 dot products) or to int8 as llama.cpp does: half the integer work,
so prefill and batched decode run ~1.5-1.7x faster where the matmuls are compute-bound. Int8 is
close on most models, but on some it flips near-tied greedy choices: the embedded SmolLM2 answers
"What is the capital of France?" with French nonsense instead of Paris. So the load measures it:
the first :data:`PROBE_TOKENS` tokens of :data:`PROBE_TEXT` go through the model in both
precisions, and int8 is kept when the mean KL(15-bit || int8) over those positions is at most
:data:`MAX_KL` nats. Measured (128 tokens): SmolLM2-135M Q4_1 0.0029 (stays 15-bit),
Qwen2.5-Coder-0.5B Q4_K_M 0.0005 (int8; its greedy answers are unchanged).

``METRALE_GGUF_ACTIVATIONS`` = ``fine`` / ``int8`` fixes the choice without a probe; ``auto``
(or unset) measures. The measured KL is kept in the repack cache (``layers.repack_cache``, keyed
by the file's path, size and modification time, :data:`PROBE_VERSION` and whether the C kernel
runs), so a later start of the same file reads it instead of probing (~1.4 s for a 0.5B model on
2 cores).

Invariants:
- The choice is one flag shared by every projection of the model
  (``gguf_linear.ActivationPrecision``), set before the first request and never changed after,
  so every request sees the same arithmetic and batch invariance holds in either precision.
- A model with no GGUF projection is untouched; a probe that fails leaves 15-bit (logged).
- The probe runs the model over a KV pool of its own (no engine is built); the pool and the
  logits are freed before this returns.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from attrs import define, evolve, field, frozen
from loguru import logger

from metrale_core.errors import ConfigError
from metrale_core.layers.formats import repack_cache
from metrale_core.layers.formats.gguf_linear import ActivationPrecision

__all__ = [
    "ACTIVATIONS_ENV",
    "MAX_KL",
    "PROBE_TEXT",
    "PROBE_TOKENS",
    "ProbeResult",
    "all_position_logits",
    "choose_activation_precision",
]

#: Environment variable: ``auto`` (default: measure), ``fine`` (15-bit) or ``int8``.
ACTIVATIONS_ENV = "METRALE_GGUF_ACTIVATIONS"
#: Int8 activations are kept when their mean KL against 15-bit is at most this (nats per token).
MAX_KL = 1.2e-3
PROBE_TOKENS = 128
#: Bump when the probe (text, tokens) or the kernels' arithmetic changes what it measures.
PROBE_VERSION = 1
#: Prose, then code: what the model will mostly be asked for.
PROBE_TEXT = """The lighthouse stood at the edge of the cliff, its white paint peeling after decades of
salt wind. Every evening the keeper climbed the spiral stairs, trimmed the wick and watched the
ships pass far out at sea. Nobody in the village remembered when the light had last failed.

def merge_sorted(a, b):
    \"\"\"Merge two sorted lists into one sorted list.\"\"\"
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    return out + a[i:] + b[j:]
"""


@frozen
class ProbeResult:
    """What :func:`choose_activation_precision` decided: ``fine`` (15-bit) or not, the measured
    mean KL (None when not measured) and why."""

    fine: bool
    kl: float | None
    reason: str


class _AllRows:
    """Wraps a model so one prefill keeps the logits of every row (the probe's positions)."""

    def __init__(self, model: Any) -> None:
        self.model, self.info = model, model.info
        self.logits: torch.Tensor | None = None

    def make_state_pool(self, n: int) -> Any:
        return self.model.make_state_pool(n)

    def forward(self, batch: Any, kv: Any, state: Any = None) -> torch.Tensor:
        every = evolve(batch, logits_rows=torch.arange(batch.num_rows, device=batch.input_ids.device))
        logits = self.model.forward(every, kv, state).float()
        self.logits = logits
        return logits[batch.logits_rows]


@define(eq=False)
class _Rows:
    """The one "sequence" of :func:`all_position_logits` (what a ``BlockManager`` reads)."""

    request_id: str
    block_ids: list[int] = field(factory=list)
    group_block_ids: list[list[int]] = field(factory=list)


def all_position_logits(model: Any, ids: list[int], block_size: int = 16, kv_storage: Any = None) -> torch.Tensor:
    """Float32 logits ``[len(ids), vocab]`` of every position of ``ids``, from one prefill of
    ``model`` over a paged KV pool of its own (``engine.SidePool``: the engine's runner and
    block layout, no engine; the probe's, and ``bench/bench_quality.py``'s teacher forcing);
    ``kv_storage`` (``engine.kv_dtype.KVStorage``): the pool's storage (None: the model's)."""
    from metrale_core.engine.side_pool import SidePool

    capture = _AllRows(model)
    groups = len(model.info.kv.groups.windows) if model.info.kv is not None else 1
    pool = SidePool(capture, groups * (-(-len(ids) // block_size) + 1), block_size, kv_storage)
    rows = _Rows("all-positions")
    pool.blocks.grow(rows, len(ids))
    pool.execute([pool.chunk(rows, 0, ids)])
    assert capture.logits is not None and capture.logits.shape[0] == len(ids)
    return capture.logits


def _mean_kl(p_logits: torch.Tensor, q_logits: torch.Tensor, chunk: int = 16) -> float:
    """Mean over rows of KL(p || q), ``chunk`` rows at a time (a 150k vocabulary's temporaries
    stay ~10 MB each)."""
    total = 0.0
    for i in range(0, p_logits.shape[0], chunk):
        lp, lq = torch.log_softmax(p_logits[i : i + chunk], dim=-1), torch.log_softmax(q_logits[i : i + chunk], dim=-1)
        total += float((lp.exp() * (lp - lq)).sum(-1).double().sum())
    return total / p_logits.shape[0]


def _fixed(cell: ActivationPrecision) -> ProbeResult | None:
    wanted = os.environ.get(ACTIVATIONS_ENV, "auto").strip().lower()
    if wanted in ("", "auto"):
        return None
    if wanted not in ("fine", "int8"):
        raise ConfigError(f"{ACTIVATIONS_ENV}={wanted!r} is not one of auto, fine, int8")
    cell.fine = wanted == "fine"
    return ProbeResult(cell.fine, None, f"{ACTIVATIONS_ENV}={wanted}")


def _measure(model: Any, tokenizer: Any, cell: ActivationPrecision) -> float:
    ids = tokenizer.encode(PROBE_TEXT)[:PROBE_TOKENS]
    cell.fine = True
    fine = all_position_logits(model, ids)
    cell.fine = False
    coarse = all_position_logits(model, ids)
    return _mean_kl(fine, coarse)


def choose_activation_precision(
    model: Any, tokenizer: Any, cell: ActivationPrecision, source: Path | None = None, native: bool = True
) -> ProbeResult:
    """Set ``cell`` (the shared precision of ``model``'s GGUF projections) to 15-bit or int8 as the
    module docstring says, log the choice at INFO and return it.  ``source``: the checkpoint file
    (the cached KL's key; None: always measure); ``native``: whether the C kernel runs."""
    result = _fixed(cell)
    if result is None:
        start = time.perf_counter()
        key = None if source is None else repack_cache.file_key(source, f"probe{PROBE_VERSION}", f"native{native:d}")
        cached = repack_cache.load(key, 8)
        if cached is not None:
            kl, how = float(np.asarray(cached).view(np.float64)[0]), "cached"
        else:
            try:
                kl, how = _measure(model, tokenizer, cell), "measured"
            except Exception as exc:  # the model still loads, in the safe precision
                cell.fine = True
                logger.opt(exception=exc).warning("activation probe failed; GGUF activations stay 15-bit")
                return ProbeResult(True, None, f"probe failed ({type(exc).__name__})")
            repack_cache.store(key, np.array([kl], dtype=np.float64).view(np.uint8))
        cell.fine = kl > MAX_KL
        verdict = "above" if cell.fine else "within"
        result = ProbeResult(
            cell.fine,
            kl,
            f"int8's mean KL against 15-bit over {PROBE_TOKENS} probe tokens is {kl:.2g} ({how}), {verdict} "
            f"{MAX_KL:g}; {time.perf_counter() - start:.2f} s",
        )
    logger.info("GGUF activations: {} ({})", "15-bit" if result.fine else "int8", result.reason)
    return result
