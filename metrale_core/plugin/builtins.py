"""The core's own components, registered through the same hooks as any external plugin.

Owner: ``metrale_core.plugin.discovery.load_registry()`` registers this module first, under the plugin
name ``builtins`` (distribution ``metrale-core``); ``METRALE_DISABLE_PLUGINS=builtins`` blocks it
like any other plugin.

Invariants:
- Importing this module imports nothing heavy: every factory imports its implementation lazily,
  when the engine builds it.
"""

from __future__ import annotations

from metrale_core import hookimpl
from metrale_core.plugin.components import (
    ExecutorSpec,
    KVScaleSourceSpec,
    LogitProcessorSpec,
    SamplerSpec,
    SchedulerSpec,
    ToolCallParserSpec,
)
from metrale_core.plugin.discovery import lazy_factory


@hookimpl
def metrale_samplers(register):
    register(
        SamplerSpec(
            name="default",
            factory=lazy_factory("metrale_core.sampling.sampler:DefaultSampler"),
            description="torch sampler: greedy, temperature, top-k/top-p/min-p, penalties, seeds",
        )
    )


@hookimpl
def metrale_logit_processors(register):
    register(
        LogitProcessorSpec(
            name="reasoning-budget",
            factory=lazy_factory("metrale_core.sampling.reasoning_budget:ReasoningBudgetProcessor"),
            # before structured output (50): the grammar starts after the forced </think>
            order=40,
            description="ends the reasoning of a request with a budget (thinking_token_budget) once it is spent",
        )
    )


@hookimpl
def metrale_schedulers(register):
    register(
        SchedulerSpec(
            name="fcfs",
            factory=lazy_factory("metrale_core.engine.policy:FcfsPolicy"),
            description="first come, first served scheduling policy",
        )
    )


@hookimpl
def metrale_tool_call_parsers(register):
    from metrale_core.streamparse.parser import BUILTIN_TOOL_PARSERS  # a table; no parser imported

    for name, (target, model_types) in BUILTIN_TOOL_PARSERS.items():
        register(
            ToolCallParserSpec(
                name=name,
                factory=lazy_factory(target),
                model_types=model_types,
                description=f"streaming {name} tool-call parser",
            )
        )


#: The built-in executors (``metrale_core.parallel.executors``): name -> (class, description).
_EXECUTORS = {
    "uni": ("UniExecutor", "one process, no tensor parallelism (the default for size 1)"),
    "mp": ("MpExecutor", "worker processes on this machine (the default for size > 1)"),
    "env": ("EnvExecutor", "ranks started by torchrun / 'met worker' (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK)"),
}


@hookimpl
def metrale_executors(register):
    for name, (cls, description) in _EXECUTORS.items():
        register(
            ExecutorSpec(
                name=name, factory=lazy_factory(f"metrale_core.parallel.executors:{cls}"), description=description
            )
        )


@hookimpl
def metrale_kv_scale_sources(register):
    register(
        KVScaleSourceSpec(
            name="q8_0",
            factory=lazy_factory("metrale_core.layers.kv_q8_codec:q8_0_source"),
            kv_dtypes=("q8_0",),
            description="llama.cpp's q8_0 K/V (int8 codes, a float16 scale per 32 values), CPU",
        )
    )
