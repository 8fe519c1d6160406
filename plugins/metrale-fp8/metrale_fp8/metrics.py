"""The FP8 KV scales as Prometheus metric families (``metrale_metrics``).

Owner: ``metrale_fp8``; the server calls the hook once per ``/metrics`` scrape.

Invariants: reads only what the codec already keeps (no engine step, no device work beyond
reading 2 * layers scalars); an engine whose KV cache is not FP8 exports nothing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["fp8_codec_of", "metric_families"]


def fp8_codec_of(engine: Any):
    """The engine's ``Fp8KVCodec``, or None."""
    from metrale_fp8.codec import Fp8KVCodec

    kv = getattr(getattr(engine, "runner", None), "kv", None)
    codec = getattr(kv, "codec", None)
    return codec if isinstance(codec, Fp8KVCodec) else None


def metric_families(engine: Any) -> list:
    """``metrale:fp8_kv_scale{layer,tensor,source}``, ``metrale:fp8_kv_scale_source_layers{source}``
    and ``metrale:fp8_kv_calibration_open_layers``."""
    codec = fp8_codec_of(engine)
    if codec is None:
        return []
    from prometheus_client.core import GaugeMetricFamily

    scale = GaugeMetricFamily(
        "metrale:fp8_kv_scale",
        "FP8 KV dequant scale per attention layer and tensor, by source",
        labels=["layer", "tensor", "source"],
    )
    counts: dict[str, int] = {"checkpoint": 0, "calibration": 0, "unit": 0}
    for row in codec.layer_report():
        counts[row["source"]] = counts.get(row["source"], 0) + 1
        scale.add_metric([str(row["layer"]), "k", row["source"]], row["k_scale"])
        scale.add_metric([str(row["layer"]), "v", row["source"]], row["v_scale"])
    layers = GaugeMetricFamily(
        "metrale:fp8_kv_scale_source_layers",
        "Attention layers whose FP8 KV scales come from each source",
        labels=["source"],
    )
    for source, count in counts.items():
        layers.add_metric([source], count)
    open_windows = GaugeMetricFamily(
        "metrale:fp8_kv_calibration_open_layers",
        "Layers still calibrating (window not yet frozen)",
        value=codec.num_open_windows,
    )
    return [scale, layers, open_windows]
