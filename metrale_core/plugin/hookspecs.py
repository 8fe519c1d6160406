"""Every hook a Metrale plugin can implement: the module the plugin manager reads.

Owner: the plugin manager (``metrale_core.plugin.discovery``) adds these specs to a fresh
``pluggy.PluginManager("metrale")``.  The registration hooks (one per component family) are
defined in :mod:`metrale_core.plugin.hooks_registration` and gathered here; the command-line,
server and lifecycle hooks are defined below. ``docs/hooks.md`` is generated from the docstrings below
(``python -m metrale_core.plugin.hookspecs > docs/hooks.md``) and a test keeps the two equal.

Invariants:
- One string for everything: the project name, the entry-point group and the hook prefix are all
  ``metrale``; plugins mark implementations with ``metrale_core.hookimpl``.
- Importing this module imports nothing heavy (no torch, no CuPy): the signatures' types are
  imported under ``TYPE_CHECKING`` only (annotations are strings at run time), so static checkers
  see them and discovery stays torch-free.
- Every spec's docstring has the sections ``Called:``, ``Args:`` (one entry per argument),
  ``Returns:``, ``Flags:`` and ``Example:`` (enforced by ``tests/plugin/test_hookspecs.py``); a plain
  spec whose return value is ignored is marked ``plain_hookspec``, which writes those two sections.
- Specs evolve additively: arguments are added, never renamed or removed (pluggy lets an
  implementation accept fewer arguments than its spec).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from metrale_core.plugin import hookspec, plain_hookspec
from metrale_core.plugin.hooks_registration import (
    metrale_executors,
    metrale_kv_scale_sources,
    metrale_logit_processors,
    metrale_model_loaders,
    metrale_samplers,
    metrale_schedulers,
    metrale_speculative_proposers,
    metrale_tool_call_parsers,
)

if TYPE_CHECKING:
    import argparse

    from prometheus_client.metrics_core import Metric

__all__ = [
    "GROUPS",
    "EngineHandle",
    "hookspec",
    "metrale_engine_flags",
    "metrale_engine_started",
    "metrale_executors",
    "metrale_kv_scale_sources",
    "metrale_logit_processors",
    "metrale_metrics",
    "metrale_model_loaders",
    "metrale_samplers",
    "metrale_schedulers",
    "metrale_speculative_proposers",
    "metrale_tool_call_parsers",
    "render_reference",
]


class EngineHandle(Protocol):
    """What the engine hooks receive: the ``metrale_core.engine.LLMEngine`` itself.  Declared
    here as a protocol so the hook specifications do not import the engine (which reaches them
    through the registry: that would close an import circle); its documented surface is the
    engine's."""

    config: Any

    def stats(self) -> Any: ...


# --- command line ------------------------------------------------------------------------------


@plain_hookspec("Parsed values land on the ``argparse.Namespace`` under each flag's ``dest``.")
def metrale_engine_flags(parser: argparse._ArgumentGroup) -> None:
    """Add command-line flags for a plugin's engine options to the shared engine flag group.

    Called:
        by ``Registry.add_engine_flags(parser)`` when the CLI builds the parser of a command
        that builds an engine (``met serve``, ``met run``), once per parser and before arguments
        are parsed. Each plugin's implementation is called on its own, so a flag that clashes
        with an existing one raises ``PluginError`` naming the plugin.

    Args:
        parser: the ``argparse`` argument group "engine options" (an ``_ArgumentGroup``; it has
            ``add_argument`` like a parser). Prefix flags with the feature they belong to
            (``--fp8-kv-calibration-tokens``) and always give a default, so the flag is optional.

    Example:
        @hookimpl
        def metrale_engine_flags(parser):
            parser.add_argument("--fp8-kv-calibration-tokens", type=int, default=0,
                                help="calibrate FP8 K/V scales on this many prompt tokens")
    """


# --- server ------------------------------------------------------------------------------------


@hookspec
def metrale_metrics(engine: EngineHandle) -> Iterable[Metric] | Mapping[str, float] | None:
    """Export a plugin's own counters and gauges through the server's ``GET /metrics``.

    Called:
        by the HTTP server (``metrale_core.server.metrics``) once per scrape of ``/metrics``, on
        the server's event loop, after the engine is loaded (never while it is loading). Keep it
        cheap and non-blocking: read counters the plugin already keeps; never step the engine.
        Called through ``Registry.collect_metrics``, each plugin's implementation on its own
        through pluggy (wrappers of wrapper-only plugins wrap each call): one that raises is
        logged with its plugin name and skipped for that scrape; the others still export.

    Args:
        engine: the served ``LLMEngine`` (read-only use: ``engine.stats()``, ``engine.config``,
            ``engine.scheduler``); it is driven by another thread, so read plain attributes and
            expect a snapshot that may be one step stale.

    Returns:
        An iterable of ``prometheus_client`` metric families (``CounterMetricFamily``,
        ``GaugeMetricFamily``, ``HistogramMetricFamily``, ...), exported as given; or a dict
        ``{name: number}``, each exported as a gauge named ``name`` (use the ``metrale:``
        prefix, e.g. ``metrale:spec_decode_num_accepted_tokens``); or None for nothing. A name the
        server or another plugin already exports is dropped with a warning.

    Flags:
        plain hook (not firstresult, not historic): every plugin's implementation runs and all
        results are collected.

    Example:
        @hookimpl
        def metrale_metrics(engine):
            from prometheus_client.core import CounterMetricFamily
            accepted = CounterMetricFamily("metrale:spec_decode_num_accepted_tokens",
                                           "Draft tokens accepted", value=STATS.accepted)
            return [accepted]
    """


# --- lifecycle ---------------------------------------------------------------------------------


@plain_hookspec()
def metrale_engine_started(engine: EngineHandle) -> None:
    """Attach per-engine state to a newly built engine: snapshot extras for the dashboard, caches.

    Called:
        once per engine, by ``LLMEngine.__init__`` as its last step (the scheduler, runner, KV
        codec, logit pipeline, speculator and ``engine.snapshots`` all exist), and only when the
        engine was given a plugin registry (``met serve``, ``met generate``), through
        ``Registry.announce_engine_started``. It runs in the thread that builds the engine,
        before any request. Each plugin's implementation is called on its own through pluggy
        (``wrapper=True`` implementations of wrapper-only plugins wrap each call; hook tracing
        sees it): one that raises is logged with its plugin name and skipped, the others still
        run, and the engine is still built.

    Args:
        engine: the new ``LLMEngine``. Inspect it to decide whether the plugin is active on it
            (``engine.runner.kv.codec``, ``engine.output_processor.pipeline.processor_names``,
            ``engine.spec_driver``); publish dashboard values with
            ``engine.snapshots.set_extra(name, value, label=..., format=...)`` or
            ``engine.snapshots.add_extras_provider(name, fn, label=..., format=...)`` (``fn()``
            runs in the engine thread at every step's publish, so it must be cheap). The stats
            tab shows each extra as ``label: format(value)``, as the plugin declared it (without
            a label: ``name: value``); the core knows no extra by name. Keep per-engine state on
            objects reachable from ``engine`` (e.g. your logit processor's instance through
            ``engine.output_processor.pipeline.processor(name)``), not in module globals.

    Example:
        @hookimpl
        def metrale_engine_started(engine):
            if "my-proc" in engine.output_processor.pipeline.processor_names:
                engine.snapshots.add_extras_provider("my_count", lambda: STATS.count)
    """


#: Sections of the generated reference: (title, introduction, hook names in order).
GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "Registration hooks",
        "Called once per plugin at startup with a `register` callback that takes one frozen "
        "record from `metrale_core.plugin.components`. The core collects the records per family, "
        "rejects a name registered twice (naming both distributions) and selects components "
        "by configured name or by what a checkpoint declares.",
        (
            "metrale_model_loaders",
            "metrale_kv_scale_sources",
            "metrale_logit_processors",
            "metrale_samplers",
            "metrale_schedulers",
            "metrale_speculative_proposers",
            "metrale_tool_call_parsers",
            "metrale_executors",
        ),
    ),
    (
        "Command-line hooks",
        "Called while the CLI builds its argument parser.",
        ("metrale_engine_flags",),
    ),
    (
        "Lifecycle hooks",
        "Called as the core builds its long-lived objects, so a plugin can attach per-object state to them.",
        ("metrale_engine_started",),
    ),
    (
        "Server hooks",
        "Called by the HTTP server (`met serve`) while it runs.",
        ("metrale_metrics",),
    ),
)


def render_reference() -> str:
    """Return the Markdown hook reference (``docs/hooks.md``) rendered from the docstrings above."""
    import importlib

    from metrale_core.plugin.hookdoc import render_markdown

    return render_markdown(importlib.import_module("metrale_core.plugin.hookspecs"), GROUPS)


if __name__ == "__main__":
    print(render_reference(), end="")
