"""The registration hooks: one per component family, each called once per plugin at startup with a
``register`` callback that takes one frozen record of :mod:`metrale_core.plugin.components`.

Owner: ``metrale_core.plugin``; :mod:`metrale_core.plugin.hookspecs` gathers these with the other
hook families for the plugin manager and the generated reference (``docs/hooks.md``).

Invariants: as :mod:`metrale_core.plugin.hookspecs`' (documented sections, additive evolution,
nothing heavy imported: the record types only under ``TYPE_CHECKING``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from metrale_core.plugin import plain_hookspec

if TYPE_CHECKING:
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

__all__ = [
    "metrale_executors",
    "metrale_kv_scale_sources",
    "metrale_logit_processors",
    "metrale_model_loaders",
    "metrale_samplers",
    "metrale_schedulers",
    "metrale_speculative_proposers",
    "metrale_tool_call_parsers",
]


@plain_hookspec("Register through ``register``.")
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

    Example:
        @hookimpl
        def metrale_model_loaders(register):
            register(ModelLoaderSpec(name="mylm", model_types=("mylm",),
                                     factory=lazy_factory("metrale_mylm.model:load")))
    """


@plain_hookspec(
    "A request for a plugin dtype no source answers is a ``ConfigError`` naming the plugin that "
    "declares it (``kv_dtypes``)."
)
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

    Example:
        @hookimpl
        def metrale_kv_scale_sources(register):
            register(KVScaleSourceSpec(name="fp8", factory=lazy_factory("pkg.build:build_codec"),
                                       kv_dtypes=("fp8",)))
    """


@plain_hookspec()
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

    Example:
        @hookimpl
        def metrale_logit_processors(register):
            register(LogitProcessorSpec(name="b1-margin", factory=MarginObserver, order=900,
                                        kinds={PositionKind.FINAL_DECODE}, read_only=True))
    """


@plain_hookspec()
def metrale_samplers(register: Callable[[SamplerSpec], None]) -> None:
    """Register sampling steps (``SamplerSpec``): turn processed logits into token ids.

    Called:
        once per plugin by ``load_registry()`` at startup. The engine selects one by name
        (``--sampler``, ``EngineConfig.sampler``; the core's own is ``default``) and calls
        ``spec.factory()`` once when it is built.

    Args:
        register: ``register(spec: SamplerSpec) -> None``; call it once per sampler. A name
            already registered by another distribution raises ``DuplicateComponent``.

    Example:
        @hookimpl
        def metrale_samplers(register):
            register(SamplerSpec(name="greedy-cupy", factory=lazy_factory("pkg.sampler:Greedy")))
    """


@plain_hookspec()
def metrale_schedulers(register: Callable[[SchedulerSpec], None]) -> None:
    """Register scheduling policies (``SchedulerSpec``): which sequences run each step.

    Called:
        once per plugin by ``load_registry()`` at startup. The engine selects one by name
        (``--scheduler``, ``EngineConfig.scheduler``; the core's own is ``fcfs``) and calls
        ``spec.factory(config)`` once when it is built.

    Args:
        register: ``register(spec: SchedulerSpec) -> None``; call it once per policy. A name
            already registered by another distribution raises ``DuplicateComponent``.

    Example:
        @hookimpl
        def metrale_schedulers(register):
            register(SchedulerSpec(name="priority", factory=PriorityPolicy))
    """


@plain_hookspec()
def metrale_speculative_proposers(register: Callable[[ProposerSpec], None]) -> None:
    """Register speculative-decoding draft sources (``ProposerSpec``): n-gram, draft model, MTP.

    Called:
        once per plugin by ``load_registry()`` at startup. The engine builds the proposer named
        by ``--speculative`` (if any) when it is constructed.

    Args:
        register: ``register(spec: ProposerSpec) -> None``; call it once per proposer. A name
            already registered by another distribution raises ``DuplicateComponent``.

    Example:
        @hookimpl
        def metrale_speculative_proposers(register):
            register(ProposerSpec(name="ngram", factory=NgramProposer))
    """


@plain_hookspec()
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

    Example:
        @hookimpl
        def metrale_tool_call_parsers(register):
            register(ToolCallParserSpec(name="hermes", factory=HermesParser,
                                        model_types=("qwen3",)))
    """


@plain_hookspec("Register through ``register``.")
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

    Example:
        @hookimpl
        def metrale_executors(register):
            register(ExecutorSpec(name="slurm", description="ranks from srun",
                                  factory=lazy_factory("metrale_slurm.executor:SlurmExecutor")))
    """
