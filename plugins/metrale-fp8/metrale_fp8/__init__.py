"""Metrale plugin: FP8 (E4M3) KV cache with checkpoint scales or online calibration.

Owner: ``metrale_fp8``.  Registers the ``fp8`` KV-scale source (``--kv-cache-dtype fp8``), the
flags ``--fp8-kv-calibration-tokens`` / ``--fp8-kv-headroom``, the FP8 scale metrics and, on
every FP8 engine, the dashboard's ``fp8_scale_source`` line (``metrale_engine_started``).

Invariants: importing this package imports neither torch nor CuPy (the factory is lazy, so
``met plugins`` stays fast); the classification and log lines follow seed 001 exactly
(``scale_source.py``).
"""

from __future__ import annotations

from metrale_core import hookimpl
from metrale_core.api import KVScaleSourceSpec, lazy_factory, registers

__all__ = ["metrale_engine_flags", "metrale_engine_started", "metrale_kv_scale_sources", "metrale_metrics"]


#: The ``metrale_kv_scale_sources`` hook.  Register the ``fp8`` source: checkpoint scales, online
#: calibration or 1.0, per layer.
metrale_kv_scale_sources = registers(
    KVScaleSourceSpec(
        name="fp8",
        factory=lazy_factory("metrale_fp8.build:build_codec"),
        kv_dtypes=("fp8",),
        description="FP8 E4M3 KV storage; per-layer K/V scales from the checkpoint, online "
        "calibration (--fp8-kv-calibration-tokens) or 1.0",
    )
)


@hookimpl
def metrale_engine_flags(parser) -> None:
    """Add ``--fp8-kv-calibration-tokens`` and ``--fp8-kv-headroom``."""
    from metrale_fp8.options import add_flags

    add_flags(parser)


@hookimpl
def metrale_metrics(engine):
    """Per-layer FP8 K/V scales and their sources (nothing unless the KV cache is FP8)."""
    from metrale_fp8.metrics import metric_families

    return metric_families(engine)


@hookimpl
def metrale_engine_started(engine) -> None:
    """Publish the per-layer scale source as the ``fp8_scale_source`` extra (FP8 engines only)."""
    from metrale_fp8.dashboard import attach

    attach(engine)
