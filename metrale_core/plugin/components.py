"""Registration records (``<Thing>Spec``) that plugins hand to the registration hooks.

Owner: the plugin manager (``metrale_core.plugin.discovery``) collects these through the ``metrale_*``
registration hooks in ``metrale_core.plugin.hookspecs``.

Invariants:
- Every record is frozen; ``name`` is unique within its family across all installed
  distributions (a duplicate is an error naming both distributions).
- ``factory`` is a plain callable; nothing calls pluggy per token: plugins are resolved to
  plain objects when the engine is built.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attrs import field, frozen

from metrale_core.sampling.position import PositionKind

__all__ = [
    "ExecutorSpec",
    "KVScaleSourceSpec",
    "LoadOptions",
    "LogitProcessorSpec",
    "ModelLoaderSpec",
    "ProposerSpec",
    "SamplerSpec",
    "SchedulerSpec",
    "ToolCallParserSpec",
]


def _frozenset(value: Any) -> frozenset:
    return frozenset(value)


def _tuple(value: Any) -> tuple:
    if isinstance(value, str):
        return (value,)
    return tuple(value)


@frozen
class _Component:
    """What every record below starts with: its ``name`` (unique in its family) and the
    ``factory`` that builds the component (what it is called with is the family's)."""

    name: str
    factory: Callable[..., Any]


@frozen
class LoadOptions:
    """How the engine wants a model built."""

    #: Activation / weight dtype name ("float32", "bfloat16", "float16").
    dtype: str = "float32"
    #: torch device string.
    device: str = "cpu"
    #: How linear weights are kept: "exact" (dequantized to ``dtype``, the default), or a
    #: loader-specific lossy format ("bf16", "int8", "int4"); None lets the loader decide.
    weight_format: str | None = None
    #: This rank's tensor-parallel group (``metrale_core.layers.parallel.TensorParallel``); None
    #: without tensor parallelism.  Only a loader whose spec sets ``tensor_parallel`` gets one.
    tensor_parallel: Any = field(default=None, eq=False)


@frozen
class ModelLoaderSpec(_Component):
    """A loader for checkpoints whose config declares one of ``model_types`` / ``architectures``.

    ``factory(store, options)`` receives a ``metrale_core.weights.WeightStore`` and
    :class:`LoadOptions` and returns a :class:`metrale_core.model_api.CausalLM`.
    """

    #: HF ``config.json`` ``model_type`` values (GGUF ``general.architecture`` maps onto these).
    model_types: tuple[str, ...] = field(default=(), converter=_tuple)
    #: HF ``architectures`` entries, e.g. ``"Qwen3ForCausalLM"``.
    architectures: tuple[str, ...] = field(default=(), converter=_tuple)
    description: str = ""
    #: The ``LoadOptions.weight_format`` values (``--weight-format``) this loader honours; the
    #: core refuses any other explicitly requested format before calling ``factory`` (None, the
    #: default request, lets the loader decide).  Every loader keeps ``"exact"`` weights.
    weight_formats: tuple[str, ...] = field(default=("exact",), converter=_tuple)
    #: The loader builds a rank's shard when ``LoadOptions.tensor_parallel`` is set (the model
    #: contract, ``metrale_core.model_api``, says how); the core refuses
    #: ``--tensor-parallel-size`` > 1 for any other loader, with ``tensor_parallel_note``.
    tensor_parallel: bool = False
    #: Why the loader has no tensor parallelism (shown in that refusal).
    tensor_parallel_note: str = ""


@frozen
class KVScaleSourceSpec(_Component):
    """A KV storage dtype served by a plugin (``--kv-cache-dtype fp8``) and where its scales come from.

    ``factory(request)`` receives a ``metrale_core.engine.kv_dtype.KVCodecRequest`` for every
    engine built and returns a ``metrale_core.model_api.KVCodec`` when ``request.kv_cache_dtype``
    is the dtype it serves, else None (after refusing its own options that need that dtype).
    """

    #: The ``--kv-cache-dtype`` names this source serves (``("fp8",)``): how the core learns
    #: which KV dtypes exist beyond its own, for ``met plugins`` and error messages.
    kv_dtypes: tuple[str, ...] = field(default=(), converter=_tuple)
    description: str = ""


@frozen
class LogitProcessorSpec(_Component):
    """A stage of the logit pipeline.

    ``factory(engine_config)`` returns an object with ``__call__(logits, ctx)``, or None to stay
    out of this engine's pipeline (say, when its enabling flag in
    ``engine_config.plugin_options`` is off); it is run on the ``[N, V]`` logits of the positions
    whose kind is in ``kinds``, in ascending ``order``.
    A ``read_only`` processor (an observer) must not write the logits; the pipeline checks it in
    debug mode and tests compare bit-for-bit.
    """

    order: int = 100
    kinds: frozenset[PositionKind] = field(default=frozenset(PositionKind), converter=_frozenset)
    read_only: bool = False
    #: Enabled unless the configuration turns it off.
    default_enabled: bool = True
    description: str = ""


@frozen
class SamplerSpec(_Component):
    """The sampling step: ``factory()`` returns a ``metrale_core.sampling.Sampler``."""

    description: str = ""


@frozen
class SchedulerSpec(_Component):
    """A scheduling policy: ``factory(config)`` returns a policy object (see ``engine.scheduler``)."""

    description: str = ""


@frozen
class ProposerSpec(_Component):
    """A speculative-decoding draft source (n-gram, draft model, MTP head)."""

    description: str = ""


@frozen
class ToolCallParserSpec(_Component):
    """A streaming parser for one tool-call wire format (hermes, qwen3_coder, glm47, ...)."""

    #: Model types that use this format by default.
    model_types: tuple[str, ...] = field(default=(), converter=_tuple)
    description: str = ""


@frozen
class ExecutorSpec(_Component):
    """Where the ranks of a tensor-parallel job run (``--distributed-executor-backend NAME``).

    ``factory()`` returns a fresh executor with ``launch(world) -> Rendezvous`` (start ranks
    1..world-1, each running ``metrale_core.parallel.worker.run_worker`` with the torch.distributed
    variables of ``Rendezvous.env(rank)``; return rank 0's), ``poll() -> str | None`` (why a rank
    is gone) and ``shutdown(timeout)`` (reap every worker); see ``metrale_core.parallel.executors``.
    """

    description: str = ""
