"""The ``fp8`` KV-scale source: from an engine's ``KVCodecRequest`` to an ``Fp8KVCodec``.

Owner: ``metrale_fp8``; registered through ``metrale_kv_scale_sources`` and called by
``metrale_core.engine.kv_dtype.resolve_kv_storage`` for every engine built.

Invariants:
- For a KV dtype other than fp8 it only refuses its own options (a non-zero
  ``--fp8-kv-calibration-tokens``) and returns None.
- For fp8: options resolved (flag -> MODEL.toml -> 0), checkpoint census run, the source
  classified and logged once (seed 001's lines), then every KV layer gets its checkpoint scale
  (``census.load_kv_scales``, the resolver the census uses), calibration, or 1.0.  With
  calibration on, every layer calibrates and the checkpoint scales are not used.
- KV layer ``i`` is checkpoint layer ``model.kv_layer_ids[i]`` when the model declares it (hybrid
  models whose attention layers are a subset), else ``i``.
"""

from __future__ import annotations

from typing import Any

import torch
from loguru import logger

from metrale_fp8.census import kv_scale_census
from metrale_fp8.codec import Fp8KVCodec
from metrale_fp8.options import refuse_without_fp8, resolve_fp8_options
from metrale_fp8.scale_source import Calibration, fp8_kv_scale_source, log_fp8_kv_scale_source

__all__ = ["build_codec", "describe_sources", "kv_layer_ids"]


def kv_layer_ids(model: Any, num_layers: int) -> list[int]:
    """Checkpoint layer index of each KV layer."""
    ids = getattr(model, "kv_layer_ids", None)
    if ids is None:
        return list(range(num_layers))
    ids = [int(i) for i in ids]
    if len(ids) != num_layers:
        raise ValueError(f"model.kv_layer_ids has {len(ids)} entries for {num_layers} KV layers")
    return ids


def describe_sources(sources: list[str]) -> str:
    """``["checkpoint", "checkpoint", "unit"]`` -> ``"checkpoint: 0-1; unit: 2"``."""
    runs: dict[str, list[str]] = {}
    start = 0
    for i in range(1, len(sources) + 1):
        if i == len(sources) or sources[i] != sources[start]:
            runs.setdefault(sources[start], []).append(str(start) if i - 1 == start else f"{start}-{i - 1}")
            start = i
    return "; ".join(f"{src}: {', '.join(spans)}" for src, spans in runs.items()) or "none"


def build_codec(request: Any) -> Fp8KVCodec | None:
    """The factory of the ``fp8`` ``KVScaleSourceSpec`` (see the module docstring)."""
    if request.kv_cache_dtype != "fp8":
        refuse_without_fp8(request.options, request.kv_cache_dtype)
        return None
    options = resolve_fp8_options(request.options, request.model_path)
    layout = request.layout
    if request.store is None:
        logger.debug("fp8 KV: no weight store attached to the model; no checkpoint scales")
    census = kv_scale_census(request.store, num_kv_heads=layout.num_kv_heads)
    source = fp8_kv_scale_source(options.calibration_tokens, census.num_layers, layout.num_layers)
    log_fp8_kv_scale_source(source, census, options.auto_enabled)
    k_scales, v_scales, sources = [], [], []
    for checkpoint_layer in kv_layer_ids(request.model, layout.num_layers):
        scales = census.layers.get(checkpoint_layer)
        if isinstance(source, Calibration):
            k, v, src = torch.ones(1), torch.ones(1), "calibration"
        elif scales is not None:
            k, v, src = scales.k_scale, scales.v_scale, "checkpoint"
        else:
            k, v, src = torch.ones(1), torch.ones(1), "unit"
        k_scales.append(k)
        v_scales.append(v)
        sources.append(src)
    logger.info("FP8 KV scale source per layer: {}", describe_sources(sources))
    codec = Fp8KVCodec(
        layout.num_kv_heads,
        k_scales,
        v_scales,
        sources,
        calibration_tokens=options.calibration_tokens,
        headroom=options.headroom,
        device=request.device,
        source=source,
    )
    return codec
