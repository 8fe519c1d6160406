"""Metrale plugin: structured output and forced tool calls, enforced with llguidance.

Owner: ``metrale_structured``.  Registers the logit processor ``structured-output`` (a mask, on
every position kind, :data:`ORDER` in the pipeline) through ``metrale_logit_processors``; binds it
to each engine's tokenizer and publishes the ``structured`` dashboard extra through
``metrale_engine_started``; exports Prometheus metrics through ``metrale_metrics``.  The server
carries each request's constraint as ``SamplingParams.structured`` (``metrale_core.server.
structured``); the grammar of each kind is built in :mod:`metrale_structured.grammars`, compiled
and cached in :mod:`metrale_structured.compiler`, applied in :mod:`metrale_structured.processor`.

Invariants: importing this package imports neither torch nor llguidance (the factory is lazy).
"""

from __future__ import annotations

from metrale_core import hookimpl
from metrale_core.api import LogitProcessorSpec, PositionKind, lazy_factory, registers

__all__ = ["EXTRA_NAME", "NAME", "ORDER", "metrale_engine_started", "metrale_logit_processors", "metrale_metrics"]

#: The processor's name in the registry (and in ``LogitPipeline.processor_names``).
NAME = "structured-output"
#: Before every other processor: observers (B1 at 150) see masked logits, and plugin penalties
#: (metrale-dry at 200) never revive a masked token (``-inf`` stays ``-inf``).
ORDER = 50
#: Snapshot extra the dashboard's stats tab lists.
EXTRA_NAME = "structured"


#: The ``metrale_logit_processors`` hook.  Register ``structured-output``: the grammar mask of constrained requests.
metrale_logit_processors = registers(
    LogitProcessorSpec(
        name=NAME,
        factory=lazy_factory("metrale_structured.processor:make_processor"),
        order=ORDER,
        kinds=set(PositionKind),
        description="structured output: masks the rows of requests with response_format / "
        "structured_outputs / json_schema / grammar / forced tool calls (llguidance)",
    )
)


def _processor(engine):
    pipeline = getattr(getattr(engine, "output_processor", None), "pipeline", None)
    if pipeline is None or not hasattr(pipeline, "processor"):
        return None
    return pipeline.processor(NAME)


@hookimpl
def metrale_engine_started(engine) -> None:
    """Bind the processor to the engine's tokenizer (llguidance tokenizer built once per model)
    and publish the ``structured`` extra."""
    processor = _processor(engine)
    if processor is None or engine.tokenizer is None:
        return
    processor.bind(engine.tokenizer, engine.model.info.vocab_size, engine.output_processor.eos_token_ids)
    from metrale_structured.stats import STATS

    engine.snapshots.add_extras_provider(EXTRA_NAME, STATS.snapshot)


@hookimpl
def metrale_metrics(engine):
    """Constrained requests, mask time per step and grammar compile time."""
    if _processor(engine) is None:
        return None
    from prometheus_client.core import CounterMetricFamily, SummaryMetricFamily

    from metrale_structured.stats import STATS

    return [
        CounterMetricFamily(
            "metrale:structured_requests", "Constrained (structured-output) sequences masked", value=STATS.requests
        ),
        SummaryMetricFamily(
            "metrale:structured_mask_seconds",
            "Seconds per step spent filling and applying grammar masks",
            count_value=STATS.mask_steps,
            sum_value=STATS.mask_seconds,
        ),
        SummaryMetricFamily(
            "metrale:structured_compile_seconds",
            "Seconds per grammar compile (cache misses)",
            count_value=STATS.compiled,
            sum_value=STATS.compile_total_s,
        ),
        CounterMetricFamily(
            "metrale:structured_grammar_cache_hits", "Compiled-grammar cache hits", value=STATS.cache_hits
        ),
    ]
