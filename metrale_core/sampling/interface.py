"""The types the logit pipeline, its processors and samplers exchange.

Owner: the sampling package.  The output processor hands the pipeline one :class:`RowLike` per
logits row; logit-processor plugins implement :class:`LogitProcessor`; sampler plugins implement
:class:`Sampler` and return a :class:`SampleOutput`.

Invariants:
- Row ``i`` of every ``[N, V]`` logits tensor belongs to ``rows[i]`` and ``kinds[i]``.
- A :class:`ProcessorContext` lists the batch rows a processor was given, in batch order; row
  ``j`` of the logits the processor receives is batch row ``ctx.indices[j]``.
- Masking is done with ``-inf``, never ``+inf`` or NaN.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from attrs import field, frozen

from metrale_core.errors import MetraleError
from metrale_core.sampling.params import SamplingParams, as_tuple
from metrale_core.sampling.position import PositionKind

__all__ = [
    "LogitProcessor",
    "ProcessorContext",
    "RowLike",
    "SampleOutput",
    "Sampler",
    "SamplingError",
]


class SamplingError(MetraleError):
    """A logits row cannot be sampled (every token masked, or NaN logits)."""


@runtime_checkable
class RowLike(Protocol):
    """What the pipeline reads of the sequence that owns one logits row."""

    #: The request's sampling parameters.
    params: SamplingParams
    #: Prompt token ids (repetition penalty history).
    prompt_ids: Sequence[int]
    #: Output token ids generated before this position (penalty history).
    output_ids: Sequence[int]
    #: Per-request generator seeded by the engine; ``None`` uses torch's global generator.
    generator: torch.Generator | None
    #: Per-sequence plugin state, keyed by plugin name.
    extras: dict


@frozen
class ProcessorContext:
    """The batch rows one logit processor is run on (only rows whose kind it declared)."""

    #: Batch row index of each logits row the processor receives, ascending.
    indices: tuple[int, ...] = field(converter=as_tuple)
    #: The sequence state of each of those rows.
    rows: tuple[Any, ...] = field(converter=as_tuple)
    #: The position kind of each of those rows.
    kinds: tuple[PositionKind, ...] = field(converter=as_tuple)

    def __len__(self) -> int:
        return len(self.indices)


@runtime_checkable
class LogitProcessor(Protocol):
    """A logit-processor instance, built once by ``LogitProcessorSpec.factory(engine_config)``.

    ``__call__(logits, ctx)`` receives the ``[len(ctx), V]`` float32 logits of its rows.  A
    writing processor either modifies ``logits`` in place and returns ``None``, or returns a new
    tensor of the same shape.  A read-only processor (an observer) must not write ``logits``;
    its return value is ignored.

    Optional members the pipeline honours: ``wants_row(row) -> bool`` (only wanted rows are
    passed; none wanted means no call and no copy of the logits), ``validate_params(params)``
    (called at admission by ``LogitPipeline.validate``; raise ``InvalidRequest`` to refuse) and
    ``handles_structured_output = True`` (the processor enforces ``SamplingParams.structured``).
    """

    def __call__(self, logits: torch.Tensor, ctx: ProcessorContext) -> torch.Tensor | None: ...


@frozen
class SampleOutput:
    """The tokens chosen for one batch of logits rows."""

    #: One sampled token id per row, in batch order.
    token_ids: list[int]
    #: Log-probability of each sampled token, for every row; ``None`` when no row asked for
    #: logprobs.
    logprobs: list[float] | None = None
    #: Per row, up to ``params.logprobs`` ``(token_id, logprob)`` pairs, most likely first
    #: (tokens the processing removed are not listed); ``[]`` for rows that did not ask;
    #: ``None`` when no row asked.
    top_logprobs: list[list[tuple[int, float]]] | None = None


@runtime_checkable
class Sampler(Protocol):
    """The sampling step: what a ``SamplerSpec.factory()`` returns.

    Both methods receive logits after the plugin processors, penalties and bias, and never
    modify them.
    """

    def sample(self, logits: torch.Tensor, rows: Sequence[RowLike]) -> SampleOutput:
        """Pick one token per row."""
        ...

    def process(self, logits: torch.Tensor, rows: Sequence[RowLike]) -> torch.Tensor:
        """The logits of the distribution :meth:`sample` draws from (removed tokens = ``-inf``)."""
        ...
