"""Metrale plugin: the B1 margin observer of seed 000 (low top-1/top-2 logit gaps in tool args).

Owner: ``metrale_b1``.  Registers the read-only logit processor ``b1-margin`` (``FINAL_DECODE``
positions only, :data:`ORDER` in the pipeline) through ``metrale_logit_processors``, the flag
``--b1-observer on|off`` through ``metrale_engine_flags``, the counter
``metrale:b1_low_margin_positions`` through ``metrale_metrics`` and the dashboard's ``b1_count``
extra through ``metrale_engine_started`` (both only on engines that run the observer).  The observer itself lives in
:mod:`metrale_b1.b1_margin`; the counter (``b1_low_margin``) is per engine, owned by that engine's
observer (``B1Stats``).

Invariants: importing this package imports neither torch nor CuPy nor prometheus_client (the
factory is lazy, so ``met plugins`` stays fast).
"""

from __future__ import annotations

from metrale_core import hookimpl
from metrale_core.api import LogitProcessorSpec, PositionKind, lazy_factory, registers

__all__ = [
    "EXTRA_LABEL",
    "EXTRA_NAME",
    "FLAG_DEST",
    "METRIC_NAME",
    "NAME",
    "ORDER",
    "metrale_engine_flags",
    "metrale_engine_started",
    "metrale_logit_processors",
    "metrale_metrics",
]

#: The processor's name in the registry (and in ``LogitPipeline.processor_names``).
NAME = "b1-margin"
#: Pipeline position.  ``LogitPipeline.adjusted_logits`` runs plugin processors in ascending
#: order and applies the core penalties and ``logit_bias`` only after all of them, so any order
#: is before those.  150 is after masks at the default order 100 (token bans, grammars) and
#: before plugin penalties such as metrale-dry's (order 200): the observer sees masked, unpenalised
#: logits.
ORDER = 150
#: argparse dest of ``--b1-observer`` (``EngineConfig.plugin_options`` key).
FLAG_DEST = "b1_observer"
#: Prometheus counter (exposed as ``metrale:b1_low_margin_positions_total``).
METRIC_NAME = "metrale:b1_low_margin_positions"
#: Snapshot extra the dashboard's stats tab shows as :data:`EXTRA_LABEL`.
EXTRA_NAME = "b1_count"
EXTRA_LABEL = "B1 count"


#: The ``metrale_logit_processors`` hook.  Register ``b1-margin``: a read-only observer of committed
#: (final-decode) positions.
metrale_logit_processors = registers(
    LogitProcessorSpec(
        name=NAME,
        factory=lazy_factory("metrale_b1.b1_margin:make_observer"),
        order=ORDER,
        kinds={PositionKind.FINAL_DECODE},
        read_only=True,
        description="B1 drift gauge: counts final-decode positions inside a tool parameter body "
        "whose top-1/top-2 logit gap is below 1.5 (--b1-observer)",
    )
)


@hookimpl
def metrale_engine_flags(parser) -> None:
    """``--b1-observer on|off``."""
    parser.add_argument(
        "--b1-observer",
        dest=FLAG_DEST,
        choices=("on", "off"),
        default="on",
        help="count low top-1/top-2 logit gaps (< 1.5) at decode positions inside "
        "tool-call parameter bodies; warn every 100 (default: on)",
    )


@hookimpl
def metrale_metrics(engine):
    """``metrale:b1_low_margin_positions`` of ``engine``'s observer (nothing when it runs none)."""
    from metrale_b1.b1_margin import observer_of

    observer = observer_of(engine)
    if observer is None:
        return None
    from prometheus_client.core import CounterMetricFamily

    return [
        CounterMetricFamily(
            METRIC_NAME,
            "Final-decode positions inside a tool parameter body with a top-1/top-2 "
            "logit gap below 1.5 (B1 drift gauge, b1_low_margin)",
            value=observer.stats.b1_low_margin,
        )
    ]


@hookimpl
def metrale_engine_started(engine) -> None:
    """Publish the engine's low-margin count as the ``b1_count`` extra ("B1 count" on the
    dashboard) while the engine runs the observer."""
    from metrale_b1.b1_margin import observer_of

    observer = observer_of(engine)
    if observer is None:
        return
    stats = observer.stats
    engine.snapshots.add_extras_provider(EXTRA_NAME, lambda: stats.b1_low_margin, label=EXTRA_LABEL)
