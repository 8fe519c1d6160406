"""Sampling: the logit pipeline (processors, penalties, bias) and the samplers.

Owner: the output processor builds a :class:`LogitPipeline` once per engine and calls it per step;
plugins contribute logit processors (``LogitProcessorSpec``) and samplers (``SamplerSpec``).
Invariants: see :mod:`metrale_core.sampling.pipeline` (order of stages) and
:mod:`metrale_core.sampling.sampler` (order of sampling steps).
"""

from __future__ import annotations

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
from metrale_core.sampling.sampler import DefaultSampler, truncate
from metrale_core.sampling.structured import StructuredOutput, StructuredOutputError

__all__ = [
    "DEBUG_OBSERVERS_ENV",
    "DefaultSampler",
    "LogitPipeline",
    "LogitProcessor",
    "LogitProcessorFailed",
    "ObserverWroteLogits",
    "PositionKind",
    "ProcessorContext",
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
