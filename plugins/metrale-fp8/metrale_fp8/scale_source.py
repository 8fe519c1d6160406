"""Where an FP8 KV cache's per-layer K/V scales come from at run time, and the log line that says so.

Owner: the fp8 codec factory (``metrale_fp8.build``) classifies once at engine start-up.

Invariants:
- The checkpoint count is ``kv_scale_census(store).num_layers``, which runs the resolver the
  per-layer loader uses (``census.load_kv_scales``), so "N layers from the checkpoint" is the
  number of layers that load one.
- Online calibration replaces every FP8 layer's scale, so with it on the checkpoint scales are
  loaded but not used (``shadowed``).
- The log lines are those of seed 001, word for word; Calibration and Checkpoint log at info,
  Partial and Unscaled warn.
"""

from __future__ import annotations

from attrs import frozen
from loguru import logger

from metrale_fp8.census import KvScaleCensus

__all__ = [
    "Calibration",
    "Checkpoint",
    "Fp8KvScaleSource",
    "Partial",
    "Unscaled",
    "fp8_kv_scale_source",
    "fp8_kv_scale_source_message",
    "log_fp8_kv_scale_source",
]


@frozen
class Calibration:
    """Online calibration over the first ``tokens`` tokens; the ``shadowed`` checkpoint scales are
    not used."""

    tokens: int
    shadowed: int


@frozen
class Checkpoint:
    """Every attention layer uses its checkpoint scale."""

    layers: int


@frozen
class Partial:
    """``from_checkpoint`` layers use a checkpoint scale; the other
    ``attention_layers - from_checkpoint`` run at 1.0."""

    from_checkpoint: int
    attention_layers: int


@frozen
class Unscaled:
    """No scales and no calibration: 1.0 on every layer."""

    attention_layers: int


Fp8KvScaleSource = Calibration | Checkpoint | Partial | Unscaled


def fp8_kv_scale_source(calibration_tokens: int, checkpoint_layers: int, attention_layers: int) -> Fp8KvScaleSource:
    """Classify the scale source.  ``checkpoint_layers`` may exceed ``attention_layers`` when a
    head outside the count (an MTP layer) ships scales too; that is still every counted layer."""
    if calibration_tokens > 0:
        return Calibration(tokens=calibration_tokens, shadowed=checkpoint_layers)
    if checkpoint_layers == 0:
        return Unscaled(attention_layers=attention_layers)
    if checkpoint_layers >= attention_layers:
        return Checkpoint(layers=checkpoint_layers)
    return Partial(from_checkpoint=checkpoint_layers, attention_layers=attention_layers)


def fp8_kv_scale_source_message(source: Fp8KvScaleSource, census: KvScaleCensus, auto_enabled: bool) -> tuple[str, str]:
    """``(level, message)`` of the start-up line for ``source``; ``auto_enabled`` marks a
    calibration window taken from MODEL.toml rather than the flag."""
    spellings = ", ".join(census.spellings())
    match source:
        case Calibration(tokens=tokens, shadowed=0):
            suffix = " (auto-enabled from MODEL.toml)" if auto_enabled else ""
            return "INFO", (
                "FP8 KV scales: online calibration on every layer (checkpoint ships no k/v "
                f"scales): accumulating per-tensor K/V amax over the first {tokens} observed "
                "tokens (across requests, readiness probe included) before freezing." + suffix
            )
        case Calibration(tokens=tokens, shadowed=shadowed):
            return "INFO", (
                f"FP8 KV scales: online calibration over {tokens} tokens on every layer; the "
                f"{shadowed} per-layer checkpoint scales ({spellings}) are loaded but NOT used. "
                "Pass --fp8-kv-calibration-tokens 0 to use them."
            )
        case Checkpoint(layers=layers):
            return "INFO", (
                f"FP8 KV scales: from the checkpoint on all {layers} attention layers "
                f"({spellings}); no calibration needed."
            )
        case Partial(from_checkpoint=from_checkpoint, attention_layers=attention_layers):
            return "WARNING", (
                f"FP8 KV scales: PARTIAL — the checkpoint ships scales ({spellings}) for only "
                f"{from_checkpoint} of {attention_layers} attention layers; the other "
                f"{attention_layers - from_checkpoint} run at 1.0, which wastes E4M3 range on "
                "small K/V and clips any |x| > 448. Enable --fp8-kv-calibration-tokens 256, or "
                "use --kv-cache-dtype bf16/nvfp4."
            )
        case Unscaled(attention_layers=attention_layers):
            return "WARNING", (
                f"FP8 KV scales: 1.0 on all {attention_layers} attention layers — the checkpoint "
                "ships NO k/v scales and calibration is off. 1.0 wastes E4M3 range on small K/V "
                "and clips any |x| > 448. Enable --fp8-kv-calibration-tokens 256 for online "
                "calibration, or use --kv-cache-dtype nvfp4/bf16."
            )
    raise TypeError(f"not an FP8 KV scale source: {source!r}")


def log_fp8_kv_scale_source(source: Fp8KvScaleSource, census: KvScaleCensus, auto_enabled: bool) -> None:
    """Log the start-up line (info, or warn for Partial / Unscaled)."""
    level, message = fp8_kv_scale_source_message(source, census, auto_enabled)
    logger.log(level, message)
