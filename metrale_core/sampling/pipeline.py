"""``LogitPipeline``: plugin logit processors, then penalties and bias, then the sampler.

Owner: the output processor builds one pipeline when the engine is built (processors resolved
from ``LogitProcessorSpec`` records, nothing calls pluggy per token) and calls :meth:`sample` or
:meth:`processed_logits` once per step on the ``[N, V]`` logits of that step's positions.

Invariants:
- The logits passed in are never modified (the pipeline copies before the first write).
- A processor sees only the rows whose ``PositionKind`` it declared, never any other row; a
  processor with a ``wants_row(row)`` method sees only the rows it wants (and is skipped, with no
  copy of the logits, when it wants none).
- A request with a ``structured`` constraint is refused by :meth:`LogitPipeline.validate` unless
  some processor declares ``handles_structured_output = True``; one with a ``reasoning_budget``
  unless some processor declares ``handles_reasoning_budget = True``.
- A read-only processor (observer) sees the logits after every processor of lower order (the
  masks) and before penalties and bias; if it writes them the pipeline raises
  :class:`ObserverWroteLogits` naming it.
- :meth:`LogitPipeline.prepare` (called before the forward pass) only hints: a processor's
  ``prepare(ctx)`` may start work for those rows, but its ``__call__`` must give the same result
  with or without it; a failing ``prepare`` is logged and ignored.
- :meth:`LogitPipeline.draft_prefix` never lengthens a draft: it is the shortest prefix every
  processor with a ``valid_draft_prefix`` accepts.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from loguru import logger

from metrale_core.errors import MetraleError, PluginError
from metrale_core.sampling.interface import ProcessorContext, RowLike, SampleOutput, Sampler
from metrale_core.sampling.penalties import apply_penalties_and_bias
from metrale_core.sampling.position import PositionKind
from metrale_core.sampling.structured import StructuredOutputError

if TYPE_CHECKING:  # components imports sampling.position: a runtime import here would be circular
    from metrale_core.plugin.components import LogitProcessorSpec

__all__ = ["DEBUG_OBSERVERS_ENV", "LogitPipeline", "LogitProcessorFailed", "ObserverWroteLogits"]

#: Set to ``1`` to check every observer bit-for-bit against a copy of the logits it was given
#: (catches writes that bypass torch's version counter, at the cost of one copy per observer).
DEBUG_OBSERVERS_ENV = "METRALE_DEBUG_OBSERVERS"


class ObserverWroteLogits(PluginError):
    """A read-only logit processor (an observer) modified the logits it was given."""


class LogitProcessorFailed(PluginError):
    """A logit processor raised, or returned a tensor of the wrong shape."""


class LogitPipeline:
    """The logit pipeline of one engine.  Per step, on ``[N, V]`` float32 logits:

    1. Plugin processors, in ascending ``spec.order`` (equal orders keep the given order).  Each
       runs only on the rows whose kind is in ``spec.kinds`` (skipped when there are none) and
       receives those rows' logits plus a :class:`ProcessorContext`.  A writing processor edits
       its tensor in place or returns a new one; the rows are written back into the batch.  A
       ``read_only`` processor (observer) receives the logits after the lower-order processors
       (the masks) and must not write them: torch's version counter is checked after every
       observer call, and with ``METRALE_DEBUG_OBSERVERS=1`` the tensor is also compared
       bit-for-bit with a copy taken before the call.
    2. Penalties and bias (:func:`~metrale_core.sampling.penalties.apply_penalties_and_bias`):
       repetition, presence, frequency, then ``logit_bias``.
    3. The sampler: :meth:`sample` returns a :class:`SampleOutput`; :meth:`processed_logits`
       returns the distribution the sampler draws from (temperature, top-k, top-p, min-p applied,
       removed tokens ``-inf``), which speculative decoding compares against.
    """

    def __init__(
        self,
        processors: Sequence[tuple[LogitProcessorSpec, Any]],
        sampler: Sampler,
        *,
        debug_observers: bool | None = None,
    ) -> None:
        for spec, instance in processors:
            if not callable(instance):
                raise PluginError(
                    f"logit processor {spec.name!r}: factory returned {type(instance).__name__}, "
                    "which is not callable as processor(logits, ctx)"
                )
        self._stages = sorted(processors, key=lambda pair: pair[0].order)
        self._wants = [getattr(instance, "wants_row", None) for _, instance in self._stages]
        self._draft_checks = [
            (getattr(instance, "valid_draft_prefix", None), wants)
            for (_, instance), wants in zip(self._stages, self._wants, strict=True)
        ]
        self.sampler = sampler
        if debug_observers is None:
            debug_observers = os.environ.get(DEBUG_OBSERVERS_ENV, "") not in ("", "0")
        self.debug_observers = debug_observers
        logger.debug(
            "logit pipeline: {} -> penalties_and_bias -> {}",
            " -> ".join(f"{s.name}@{s.order}" for s, _ in self._stages) or "(no processors)",
            type(sampler).__name__,
        )

    @property
    def processor_names(self) -> tuple[str, ...]:
        """Names of the plugin processors in the order they run."""
        return tuple(spec.name for spec, _ in self._stages)

    def processor(self, name: str) -> Any:
        """The instance of the processor named ``name`` in this pipeline, or None."""
        return next((inst for spec, inst in self._stages if spec.name == name), None)

    @property
    def handles_structured_output(self) -> bool:
        """True when some processor enforces ``SamplingParams.structured``."""
        return any(getattr(inst, "handles_structured_output", False) for _, inst in self._stages)

    def validate(self, params: Any) -> None:
        """Refuse a request no processor can serve: raises ``StructuredOutputError`` (an
        ``InvalidRequest``) naming the field.  Each processor with a ``validate_params(params)``
        method checks the request too (say, compiles its grammar)."""
        structured = getattr(params, "structured", None)
        if structured is not None and not self.handles_structured_output:
            raise StructuredOutputError(
                f"{structured.field or 'response_format'}: constrained decoding ({structured.kind}) "
                "needs a structured-output plugin, and none is installed (pip install "
                "metrale-structured)",
                param=structured.field or "response_format",
            )
        budget = getattr(params, "reasoning_budget", None)
        if budget is not None and not any(getattr(i, "handles_reasoning_budget", False) for _, i in self._stages):
            raise StructuredOutputError(
                f"{budget.field}: a reasoning budget needs the built-in reasoning-budget processor, which "
                "this engine was built without (METRALE_DISABLE_PLUGINS names builtins?)",
                param=budget.field,
            )
        for _, instance in self._stages:
            check = getattr(instance, "validate_params", None)
            if check is not None:
                check(params)

    def runs_on(self, kind: PositionKind) -> bool:
        """True when some processor declared ``kind`` (speculative verify re-runs the
        ``FINAL_DECODE`` stages on committed positions only when there are any)."""
        return any(kind in spec.kinds for spec, _ in self._stages)

    def draft_prefix(self, row: RowLike, token_ids: Sequence[int]) -> int:
        """How many leading ``token_ids`` (speculative drafts for ``row``) every processor with a
        ``valid_draft_prefix(row, token_ids) -> int`` method (say, a grammar) accepts; drafts
        past it would be rejected at verify anyway, so the caller trims them."""
        n = len(token_ids)
        for check, wants in self._draft_checks:
            if check is not None and n and (wants is None or wants(row)):
                n = min(n, max(0, int(check(row, tuple(token_ids[:n])))))
        return n

    def prepare(self, rows: Sequence[RowLike], kinds: Sequence[PositionKind]) -> None:
        """Before the forward pass of a step whose sampled rows will be ``rows``: each processor
        with a ``prepare(ctx)`` method may start its per-row work (a grammar mask fill) so that it
        overlaps the forward; errors are logged, and ``__call__`` redoes the work."""
        for (spec, instance), wants in zip(self._stages, self._wants, strict=True):
            start = getattr(instance, "prepare", None)
            if start is None:
                continue
            ctx = _context(spec, wants, rows, kinds)
            if ctx is None:
                continue
            try:
                start(ctx)
            except Exception as exc:  # a hint only; __call__ does the work
                logger.warning(
                    "logit processor {!r}: prepare failed ({!r}); the step computes without it", spec.name, exc
                )

    def sample(self, logits: torch.Tensor, rows: Sequence[RowLike], kinds: Sequence[PositionKind]) -> SampleOutput:
        """Run every stage and pick one token per row; ``logits`` is not modified."""
        return self.sampler.sample(self.adjusted_logits(logits, rows, kinds), rows)

    def processed_logits(
        self, logits: torch.Tensor, rows: Sequence[RowLike], kinds: Sequence[PositionKind]
    ) -> torch.Tensor:
        """The final distribution's logits (stages 1-2, then temperature/top-k/top-p/min-p)."""
        return self.sampler.process(self.adjusted_logits(logits, rows, kinds), rows)

    def adjusted_logits(
        self, logits: torch.Tensor, rows: Sequence[RowLike], kinds: Sequence[PositionKind]
    ) -> torch.Tensor:
        """Logits after the plugin processors, penalties and bias (stages 1-2)."""
        if logits.ndim != 2 or logits.shape[0] != len(rows) or len(kinds) != len(rows):
            raise ValueError(
                f"expected [N, V] logits with N = len(rows) = len(kinds); got logits "
                f"{tuple(logits.shape)}, {len(rows)} rows, {len(kinds)} kinds"
            )
        work = _Work(logits)
        for (spec, instance), wants in zip(self._stages, self._wants):
            ctx = _context(spec, wants, rows, kinds)
            if ctx is None:
                continue
            if spec.read_only:
                self._observe(spec, instance, work.tensor, ctx)
            else:
                _write(spec, instance, work, ctx)
        return apply_penalties_and_bias(work.tensor, rows)

    def _observe(self, spec: LogitProcessorSpec, instance, logits: torch.Tensor, ctx) -> None:
        view = _rows_of(logits, ctx)
        snapshot = view.clone() if self.debug_observers else None
        version = view._version
        _call(spec, instance, view, ctx)
        changed = view._version != version
        if snapshot is not None and not changed:
            changed = not torch.equal(_bits(view), _bits(snapshot))
        if changed:
            raise ObserverWroteLogits(
                f"logit processor {spec.name!r} is declared read_only but wrote the logits it "
                "was given; make it copy before editing, or declare it read_only=False"
            )


class _Work:
    """The batch logits, copied from the caller's tensor on the first write."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.tensor = logits
        self.owned = False

    def writable(self) -> torch.Tensor:
        if not self.owned:
            self.tensor = self.tensor.clone()
            self.owned = True
        return self.tensor


def _context(spec: LogitProcessorSpec, wants, rows, kinds) -> ProcessorContext | None:
    """The rows of a step ``spec``'s processor runs on (its kinds, those it wants); None if none."""
    selected = [i for i, kind in enumerate(kinds) if kind in spec.kinds and (wants is None or wants(rows[i]))]
    if not selected:
        return None
    return ProcessorContext(indices=selected, rows=[rows[i] for i in selected], kinds=[kinds[i] for i in selected])


def _rows_of(logits: torch.Tensor, ctx: ProcessorContext) -> torch.Tensor:
    """The logits of ``ctx``'s rows: the tensor itself for all rows, else a gathered copy."""
    if len(ctx) == logits.shape[0]:
        return logits
    return logits.index_select(0, _index(ctx, logits.device))


def _index(ctx: ProcessorContext, device) -> torch.Tensor:
    return torch.tensor(ctx.indices, dtype=torch.long, device=device)


def _write(spec: LogitProcessorSpec, instance, work: _Work, ctx: ProcessorContext) -> None:
    """Run a writing processor on ``ctx``'s rows and scatter its result back into the batch."""
    logits = work.writable()
    sub = _rows_of(logits, ctx)
    result = _call(spec, instance, sub, ctx)
    if result is not None:
        if tuple(result.shape) != tuple(sub.shape):
            raise LogitProcessorFailed(
                f"logit processor {spec.name!r} returned shape {tuple(result.shape)}, "
                f"expected {tuple(sub.shape)} (one row per row it was given)"
            )
        sub = result
    if sub is logits:
        return
    if len(ctx) == logits.shape[0]:
        logits.copy_(sub)
    else:
        logits.index_copy_(0, _index(ctx, logits.device), sub.to(logits.dtype))


def _call(spec: LogitProcessorSpec, instance, logits: torch.Tensor, ctx: ProcessorContext):
    try:
        return instance(logits, ctx)
    except MetraleError:
        raise
    except Exception as exc:
        raise LogitProcessorFailed(f"logit processor {spec.name!r} failed: {exc!r}") from exc


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of ``t`` (so -0.0 vs 0.0 and NaN payloads count as changes)."""
    return t.contiguous().view(torch.uint8)
