"""Every hook a Metrale plugin can implement, documented in one place.

Owner: the plugin manager (``metrale_core.plugin.discovery``) adds these specs to a fresh
``pluggy.PluginManager("metrale")``; ``docs/hooks.md`` is generated from the docstrings below
(``python -m metrale_core.plugin.hookspecs > docs/hooks.md``) and a test keeps the two equal.

Invariants:
- One string for everything: the project name, the entry-point group and the hook prefix are all
  ``metrale``; plugins mark implementations with ``metrale_core.hookimpl``.
- Importing this module imports nothing heavy (no torch, no CuPy): the signatures' types are
  imported under ``TYPE_CHECKING`` only (annotations are strings at run time), so static checkers
  see them and discovery stays torch-free.
- Every spec's docstring has the sections ``Called:``, ``Args:`` (one entry per argument),
  ``Returns:``, ``Flags:`` and ``Example:`` (enforced by ``tests/plugin/test_hookspecs.py``).
- Specs evolve additively: arguments are added, never renamed or removed (pluggy lets an
  implementation accept fewer arguments than its spec).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import pluggy

if TYPE_CHECKING:
    import argparse

    from prometheus_client.metrics_core import Metric

    from metrale_core.plugin.components import (
        ExecutorSpec,
        KVScaleSourceSpec,
        LogitProcessorSpec,
        ModelLoaderSpec,
        ProposerSpec,
        SamplerSpec,
        SchedulerSpec,
        ToolCallParserSpec,
    )

__all__ = ["GROUPS", "EngineHandle", "hookspec", "render_reference"]


class EngineHandle(Protocol):
    """What the engine hooks receive: the ``metrale_core.engine.LLMEngine`` itself.  Declared
    here as a protocol so the hook specifications do not import the engine (which reaches them
    through the registry: that would close an import circle); its documented surface is the
    engine's."""

    config: Any

    def stats(self) -> Any: ...


#: Marker for hook specifications (used only in this module).
hookspec = pluggy.HookspecMarker("metrale")


# --- registration hooks (once per plugin, at startup) -----------------------------------------


@hookspec
def metrale_model_loaders(register: Callable[[ModelLoaderSpec], None]) -> None:
    """Register model loaders (``ModelLoaderSpec``): what builds a model from a checkpoint.

    Called:
        once per plugin by ``metrale_core.plugin.discovery.load_registry()`` at startup (CLI, server,
        tests), before any checkpoint is opened. Each plugin's implementation is called on its
        own with its own ``register``, so every record is attributed to its distribution. Keep it
        cheap: import torch and the model code inside the factory, not here.

    Args:
        register: ``register(spec: ModelLoaderSpec) -> None``; call it once per loader.
            ``spec.model_types`` / ``spec.architectures`` list the HF ``config.json``
            ``model_type`` values and ``architectures`` entries it serves (GGUF metadata is mapped
            onto the same keys); ``Registry.find_model_loader(config)`` matches ``model_type``
            first, then ``architectures``. The engine calls ``spec.factory(store, options)`` with a
            ``WeightStore`` and ``LoadOptions`` and expects a ``CausalLM``. A name another
            distribution already registered raises ``DuplicateComponent``.

    Returns:
        Nothing; the return value is ignored. Register through ``register``.

    Flags:
        plain hook (not firstresult, not historic): every plugin's implementation runs.

    Example:
        @hookimpl
        def metrale_model_loaders(register):
            register(ModelLoaderSpec(name="mylm", model_types=("mylm",),
                                     factory=lazy_factory("metrale_mylm.model:load")))
    """


@hookspec
def metrale_kv_scale_sources(register: Callable[[KVScaleSourceSpec], None]) -> None:
    """Register FP8 KV-cache scale sources (``KVScaleSourceSpec``): where K/V scales come from.

    Called:
        once per plugin by ``load_registry()`` at startup. When an engine is built,
        ``metrale_core.engine.kv_dtype.resolve_kv_storage`` calls every registered source's
        ``spec.factory(request)`` with a ``KVCodecRequest`` (``kv_cache_dtype`` from
        ``--kv-cache-dtype``, the model's ``KVLayout``, the device, ``plugin_options`` and the
        checkpoint's ``WeightStore`` and path); exactly one source may answer a plugin dtype.

    Args:
        register: ``register(spec: KVScaleSourceSpec) -> None``; call it once per KV dtype the
            plugin stores (``fp8``), declaring it in ``kv_dtypes=("fp8",)`` (the core names the
            plugin that declares a dtype when that dtype is asked for but cannot be served, and
            keeps no list of plugin dtypes itself). The factory returns a ``KVCodec`` (``model_api``: ``write``,
            ``gather``, ``decode_attention``, ``storage_dtype``) for its dtype and None otherwise;
            it may raise ``ConfigError`` for its own flags used with another dtype. A name already
            registered by another distribution raises ``DuplicateComponent``.

    Returns:
        Nothing; the return value is ignored. A request for a plugin dtype no source answers is a
        ``ConfigError`` naming the plugin that declares it (``kv_dtypes``).

    Flags:
        plain hook (not firstresult, not historic): every plugin's implementation runs.

    Example:
        @hookimpl
        def metrale_kv_scale_sources(register):
            register(KVScaleSourceSpec(name="fp8", factory=lazy_factory("pkg.build:build_codec"),
                                       kv_dtypes=("fp8",)))
    """


@hookspec
def metrale_logit_processors(register: Callable[[LogitProcessorSpec], None]) -> None:
    """Register logit processors (``LogitProcessorSpec``): masks, penalties and observers.

    Called:
        once per plugin by ``load_registry()`` at startup. The engine builds the enabled
        processors once, when it is constructed, and runs them in ascending ``order`` on the
        position kinds each declares; nothing calls pluggy per token.

    Args:
        register: ``register(spec: LogitProcessorSpec) -> None``; call it once per processor.
            ``spec.read_only`` marks an observer that must not write the logits; ``spec.kinds``
            says which ``PositionKind`` rows it sees (observers of committed tokens use
            ``{FINAL_DECODE}``, never ``VERIFY``).

    Returns:
        Nothing; the return value is ignored.

    Flags:
        plain hook (not firstresult, not historic): every plugin's implementation runs.

    Example:
        @hookimpl
        def metrale_logit_processors(register):
            register(LogitProcessorSpec(name="b1-margin", factory=MarginObserver, order=900,
                                        kinds={PositionKind.FINAL_DECODE}, read_only=True))
    """


@hookspec
def metrale_samplers(register: Callable[[SamplerSpec], None]) -> None:
    """Register sampling steps (``SamplerSpec``): turn processed logits into token ids.

    Called:
        once per plugin by ``load_registry()`` at startup. The engine selects one by name
        (``--sampler``, ``EngineConfig.sampler``; the core's own is ``default``) and calls
        ``spec.factory()`` once when it is built.

    Args:
        register: ``register(spec: SamplerSpec) -> None``; call it once per sampler. A name
            already registered by another distribution raises ``DuplicateComponent``.

    Returns:
        Nothing; the return value is ignored.

    Flags:
        plain hook (not firstresult, not historic): every plugin's implementation runs.

    Example:
        @hookimpl
        def metrale_samplers(register):
            register(SamplerSpec(name="greedy-cupy", factory=lazy_factory("pkg.sampler:Greedy")))
    """


@hookspec
def metrale_schedulers(register: Callable[[SchedulerSpec], None]) -> None:
    """Register scheduling policies (``SchedulerSpec``): which sequences run each step.

    Called:
        once per plugin by ``load_registry()`` at startup. The engine selects one by name
        (``--scheduler``, ``EngineConfig.scheduler``; the core's own is ``fcfs``) and calls
        ``spec.factory(config)`` once when it is built.

    Args:
        register: ``register(spec: SchedulerSpec) -> None``; call it once per policy. A name
            already registered by another distribution raises ``DuplicateComponent``.

    Returns:
        Nothing; the return value is ignored.

    Flags:
        plain hook (not firstresult, not historic): every plugin's implementation runs.

    Example:
        @hookimpl
        def metrale_schedulers(register):
            register(SchedulerSpec(name="priority", factory=PriorityPolicy))
    """


@hookspec
def metrale_speculative_proposers(register: Callable[[ProposerSpec], None]) -> None:
    """Register speculative-decoding draft sources (``ProposerSpec``): n-gram, draft model, MTP.

    Called:
        once per plugin by ``load_registry()`` at startup. The engine builds the proposer named
        by ``--speculative`` (if any) when it is constructed.

    Args:
        register: ``register(spec: ProposerSpec) -> None``; call it once per proposer. A name
            already registered by another distribution raises ``DuplicateComponent``.

    Returns:
        Nothing; the return value is ignored.

    Flags:
        plain hook (not firstresult, not historic): every plugin's implementation runs.

    Example:
        @hookimpl
        def metrale_speculative_proposers(register):
            register(ProposerSpec(name="ngram", factory=NgramProposer))
    """


@hookspec
def metrale_tool_call_parsers(register: Callable[[ToolCallParserSpec], None]) -> None:
    """Register streaming tool-call parsers (``ToolCallParserSpec``), one per wire format.

    Called:
        once per plugin by ``load_registry()`` at startup. The frontend picks a parser by
        ``--tool-call-parser``, else by the format the chat template asks for (its tags), else
        by the model type listed in ``spec.model_types``, and builds one parser state per
        sequence.

    Args:
        register: ``register(spec: ToolCallParserSpec) -> None``; call it once per format
            (hermes, qwen3_coder, glm47, ...). A name already registered by another distribution
            raises ``DuplicateComponent``.

    Returns:
        Nothing; the return value is ignored.

    Flags:
        plain hook (not firstresult, not historic): every plugin's implementation runs.

    Example:
        @hookimpl
        def metrale_tool_call_parsers(register):
            register(ToolCallParserSpec(name="hermes", factory=HermesParser,
                                        model_types=("qwen3",)))
    """


# --- command line ------------------------------------------------------------------------------


@hookspec
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

    Returns:
        Nothing; the return value is ignored. Parsed values land on the ``argparse.Namespace``
        under each flag's ``dest``.

    Flags:
        plain hook (not firstresult, not historic): every plugin's implementation runs.

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


@hookspec
def metrale_executors(register: Callable[[ExecutorSpec], None]) -> None:
    """Register executors (``ExecutorSpec``): where the ranks of a tensor-parallel job run.

    Called:
        once per plugin by ``metrale_core.plugin.discovery.load_registry()`` at startup. ``met serve`` /
        ``met generate`` with ``--tensor-parallel-size N`` build the executor named by
        ``--distributed-executor-backend`` (default ``uni`` for N = 1, ``mp`` above) once, in
        ``metrale_core.parallel.launch.load_parallel``, before any weight is read. The core
        registers ``uni``, ``mp`` and ``env``; ``metrale-ray`` registers ``ray``.

    Args:
        register: ``register(spec: ExecutorSpec) -> None``. ``spec.factory()`` returns an object
            with ``launch(world) -> Rendezvous`` (start ranks 1..world-1, each running
            ``metrale_core.parallel.worker.run_worker(env)`` with ``Rendezvous.env(rank)``, and
            return rank 0's ``Rendezvous``), ``poll() -> str | None`` (why a rank is gone; polled
            every 0.2 s: the server fails in-flight requests and exits non-zero) and
            ``shutdown(timeout)`` (wait for the workers, then kill what is left: no orphans).
            A name another distribution already registered raises ``DuplicateComponent``.

    Returns:
        Nothing; the return value is ignored. Register through ``register``.

    Flags:
        plain hook (not firstresult, not historic): every plugin's implementation runs.

    Example:
        @hookimpl
        def metrale_executors(register):
            register(ExecutorSpec(name="slurm", description="ranks from srun",
                                  factory=lazy_factory("metrale_slurm.executor:SlurmExecutor")))
    """


# --- lifecycle ---------------------------------------------------------------------------------


@hookspec
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

    Returns:
        Nothing; the return value is ignored.

    Flags:
        plain hook (not firstresult, not historic): every plugin's implementation runs.

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
