"""Sampling: the logit pipeline (processors, penalties, bias) and the samplers.

Owner: the output processor builds a :class:`LogitPipeline` once per engine and calls it per step;
plugins contribute logit processors (``LogitProcessorSpec``) and samplers (``SamplerSpec``).
Invariants: see :mod:`metrale_core.sampling.pipeline` (order of stages) and
:mod:`metrale_core.sampling.sampler` (order of sampling steps).  Importing this package imports
no torch: the names below load their submodule on first access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from metrale_core.sampling.interface import (
        LogitProcessor,
        ProcessorContext,
        RowLike,
        SampleOutput,
        Sampler,
        SamplingError,
    )
    from metrale_core.sampling.params import SamplingParams
    from metrale_core.sampling.penalties import apply_penalties_and_bias
    from metrale_core.sampling.pipeline import (
        DEBUG_OBSERVERS_ENV,
        LogitPipeline,
        LogitProcessorFailed,
        ObserverWroteLogits,
    )
    from metrale_core.sampling.position import PositionKind
    from metrale_core.sampling.reasoning_budget import ReasoningBudget
    from metrale_core.sampling.sampler import DefaultSampler, truncate
    from metrale_core.sampling.structured import StructuredOutput, StructuredOutputError

#: Public name -> the submodule that defines it.  Imported on first use (PEP 562), so that
#: ``metrale_core.sampling.position`` (imported by ``metrale_core.plugin.components`` and so by every
#: plugin at discovery) and ``metrale_core.sampling.params`` do not pull in torch.
_EXPORTS: dict[str, str] = {
    "LogitProcessor": "interface",
    "ProcessorContext": "interface",
    "RowLike": "interface",
    "SampleOutput": "interface",
    "Sampler": "interface",
    "SamplingError": "interface",
    "SamplingParams": "params",
    "apply_penalties_and_bias": "penalties",
    "DEBUG_OBSERVERS_ENV": "pipeline",
    "LogitPipeline": "pipeline",
    "LogitProcessorFailed": "pipeline",
    "ObserverWroteLogits": "pipeline",
    "PositionKind": "position",
    "ReasoningBudget": "reasoning_budget",
    "DefaultSampler": "sampler",
    "truncate": "sampler",
    "StructuredOutput": "structured",
    "StructuredOutputError": "structured",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
    "DEBUG_OBSERVERS_ENV",
    "DefaultSampler",
    "LogitPipeline",
    "LogitProcessor",
    "LogitProcessorFailed",
    "ObserverWroteLogits",
    "PositionKind",
    "ProcessorContext",
    "ReasoningBudget",
    "RowLike",
    "SampleOutput",
    "Sampler",
    "SamplingError",
    "SamplingParams",
    "StructuredOutput",
    "StructuredOutputError",
    "apply_penalties_and_bias",
    "truncate",
]
