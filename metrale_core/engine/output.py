"""``OutputProcessor``: from a step's logits to client deltas.

Owner: ``LLMEngine.step`` calls :meth:`OutputProcessor.update` once per step with the plan and
the runner's logits.  In order: report sequences the scheduler finished (abort, timeout, error);
advance the scheduler's computed-token counts; sample every logits row through the
``LogitPipeline`` (kind ``PREFILL_LAST`` or ``FINAL_DECODE``); append the tokens; detokenize
incrementally; apply the stop rules; emit one :class:`RequestOutput` per sampled sequence.

Stop rules, checked in this order after a token is appended:
1. an EOS id (the model's plus the tokenizer's) unless ``ignore_eos`` -> ``"stop"``;
2. one of ``stop_token_ids`` -> ``"stop"`` (neither 1 nor 2 adds the token's text);
3. a stop string in the output text -> ``"stop"``; the text is cut where the stop string starts;
4. ``max_tokens`` generated -> ``"length"``;
5. the context (``max_model_len``) is full -> ``"length"``.

Invariants:
- Text that could be the start of a stop string is held back until it cannot be; a finished
  sequence flushes whatever is held.
- Without a tokenizer ``text_delta`` is always ``""`` and stop strings are not checked.
- One request's parameters can fail only that request: when sampling the batch raises, each row
  is sampled alone; a row that still fails finishes with ``"error"`` (its message in
  ``RequestOutput.error``) and every other row gets its token.  ``LLMEngine.fail_in_flight`` is
  left for failures of the step itself (the model).
- Special tokens are left out of the text, unless the sequence's stream parser says
  ``keeps_special_tokens`` (its markers are special tokens; it turns them into parsed pieces).
- A sequence's ``extras["stream_parser"]`` is fed exactly the emitted text deltas, in
  order, in the engine thread, and finished with the sequence; its pieces are
  ``RequestOutput.parsed``.  So its state is current when the next position is sampled.
"""

from __future__ import annotations

from typing import Any

import torch
from attrs import frozen
from loguru import logger

from metrale_core.engine.deltas import RequestOutput
from metrale_core.engine.plan import SchedulerOutput
from metrale_core.engine.request import Sequence
from metrale_core.engine.scheduler import Scheduler
from metrale_core.streamparse.base import held_back_len

__all__ = ["OutputProcessor", "StepUpdate"]


def _parse(seq: Sequence, delta: str, finished: bool) -> tuple:
    """Feed ``delta`` to the sequence's stream parser (if any); finish it with the sequence.

    A parser that raises is dropped (logged): the rest of the stream comes as plain content, so
    one broken parser plugin cannot fail the step of every other sequence.
    """
    parser = seq.extras.get("stream_parser")
    if parser is None:
        failed = delta and seq.extras.get("stream_parser_failed")
        return (_content_delta(delta),) if failed else ()
    try:
        parsed = parser.feed(delta) if delta else []
        if finished:
            parsed = parsed + parser.finish()
    except Exception:
        logger.exception("stream parser of request {!r} failed; sending plain content from here", seq.request_id)
        seq.extras.pop("stream_parser", None)
        seq.extras["stream_parser_failed"] = True
        return (_content_delta(delta),) if delta else ()
    return tuple(parsed)


def _row_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _sampled(plan: SchedulerOutput) -> list:
    """``(index, chunk)`` of the chunks of ``plan`` that sample a token."""
    return [(i, chunk) for i, chunk in enumerate(plan.chunks) if chunk.sample and not chunk.seq.is_finished]


def _content_delta(text: str) -> Any:
    from metrale_core.streamparse import ParsedDelta

    return ParsedDelta(content=text)


@frozen
class StepUpdate:
    """What :meth:`OutputProcessor.update` made of one step."""

    #: The step's deltas, in plan order (scheduler-finished ones first).
    outputs: list[RequestOutput]
    #: ``VerifyOutcome`` records of the step's verify chunks (speculative decoding), in plan order.
    verify_outcomes: tuple = ()


class OutputProcessor:
    """Samples, appends tokens, detokenizes and applies stop rules."""

    def __init__(
        self,
        pipeline: Any,
        scheduler: Scheduler,
        tokenizer: Any = None,
        eos_token_ids: tuple[int, ...] = (),
        max_model_len: int = 1 << 62,
    ) -> None:
        self.pipeline = pipeline
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        tok_eos = tuple(getattr(tokenizer, "eos_token_ids", ()) or ()) if tokenizer else ()
        self.eos_token_ids = frozenset(eos_token_ids) | frozenset(tok_eos)
        self.max_model_len = max_model_len

    def prepare(self, plan: SchedulerOutput) -> None:
        """Before ``plan``'s forward pass: let the pipeline start per-row work for the rows
        :meth:`update` will sample plainly (``LogitPipeline.prepare``: a grammar mask fill
        overlapping the forward)."""
        plain = [chunk for _, chunk in _sampled(plan) if not chunk.is_verify]
        if plain and hasattr(self.pipeline, "prepare"):
            self.pipeline.prepare([chunk.seq for chunk in plain], [chunk.kind for chunk in plain])

    def update(self, plan: SchedulerOutput, logits: torch.Tensor | None) -> StepUpdate:
        """Process one step: its deltas in plan order (scheduler-finished ones first).

        Verify chunks (speculative decoding; each carries its ``Draft`` record in
        ``chunk.draft``) are accepted and committed by ``metrale_core.engine.verifier``; their
        outcomes come back with the deltas.
        """
        outputs = [self.final_output(seq) for seq in plan.finished]
        self.scheduler.advance(plan)
        outcomes: list = []
        offsets, row = [], 0  # first logits row of each chunk
        for chunk in plan.chunks:
            offsets.append(row)
            row += chunk.num_logits
        sampled = _sampled(plan)
        plain = [(i, chunk) for i, chunk in sampled if not chunk.is_verify]
        by_chunk: dict[int, RequestOutput] = {}
        if plain:
            assert logits is not None, "a step that samples rows computed their logits"
            rows = [chunk.seq for _, chunk in plain]
            rows_logits = (
                logits
                if len(plain) == logits.shape[0]
                else logits[torch.tensor([offsets[i] for i, _ in plain], device=logits.device)]
            )
            kinds = [chunk.kind for _, chunk in plain]
            try:
                batch = self.pipeline.sample(rows_logits, rows, kinds)
                results = [(j, batch) for j in range(len(rows))]
            except Exception:
                results = self._sample_rows_alone(rows_logits, rows, kinds)
            for j, (i, chunk) in enumerate(plain):
                seq = chunk.seq
                k, result = results[j]
                if isinstance(result, BaseException):
                    self.scheduler.finish(seq, "error", error=_row_error(result))
                    by_chunk[i] = self.final_output(seq)
                    continue
                logprob = None
                if seq.params.logprobs is not None and result.logprobs is not None:
                    top = tuple(result.top_logprobs[k]) if result.top_logprobs is not None else ()
                    logprob = ((result.token_ids[k], result.logprobs[k], top),)
                by_chunk[i] = self._append(seq, int(result.token_ids[k]), logprob)
        verify = [(i, chunk) for i, chunk in sampled if chunk.is_verify]
        if verify:
            from metrale_core.engine.verifier import commit_verify_chunks

            assert logits is not None, "a step with verify chunks computed their logits"

            verified, outcomes = commit_verify_chunks(
                self,
                [chunk for _, chunk in verify],
                [logits[offsets[i] : offsets[i] + chunk.num_logits] for i, chunk in verify],
            )
            by_chunk.update(zip((i for i, _ in verify), verified))
        outputs.extend(by_chunk[i] for i, _ in sampled)
        self.scheduler.complete(plan)
        return StepUpdate(outputs, tuple(outcomes))

    def _sample_rows_alone(self, logits: torch.Tensor, rows: list, kinds: list) -> list:
        """``(0, SampleOutput)`` or ``(0, exception)`` per row, each row sampled by itself."""
        out: list = []
        for j, (seq, kind) in enumerate(zip(rows, kinds)):
            try:
                out.append((0, self.pipeline.sample(logits[j : j + 1], [seq], [kind])))
            except Exception as exc:
                logger.warning(
                    "sampling request {!r} failed; failing only that request: {}", seq.request_id, _row_error(exc)
                )
                out.append((0, exc))
        return out

    def final_output(self, seq: Sequence) -> RequestOutput:
        """The last delta of a sequence finished outside sampling (abort, timeout, error)."""
        self._flush(seq)
        return self._output(seq, (), None)

    def commit_token(self, seq: Sequence, token: int, logprob: tuple | None = None) -> RequestOutput:
        """Append one sampled ``token`` to ``seq`` through the normal path (stop rules,
        detokenizing, stream parser); returns its delta.  The verifier commits accepted drafts
        with it."""
        return self._append(seq, token, logprob)

    # --- internals ---------------------------------------------------------------------------
    def _append(self, seq: Sequence, token: int, logprob: tuple | None) -> RequestOutput:
        seq.output_ids.append(token)
        params = seq.params
        reason, cut = None, False
        if (token in self.eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids:
            reason = "stop"
        else:
            cut = self._push_text(seq, token)
            reason = "stop" if cut else None
        if reason is None and len(seq.output_ids) >= params.max_tokens:
            reason = "length"
        if reason is None and seq.num_tokens >= self.max_model_len:
            reason = "length"
        if reason is not None:
            if not cut:  # a stop string already cut the text; nothing may follow it
                self._flush(seq)
            self.scheduler.finish(seq, reason)
        return self._output(seq, (token,), logprob)

    def _push_text(self, seq: Sequence, token: int) -> bool:
        """Detokenize ``token`` into ``seq.text``; True when a stop string appeared (text cut)."""
        if self.tokenizer is None:
            return False
        if seq.detokenizer is None:
            from metrale_core.text.detokenizer import IncrementalDetokenizer

            # a stream parser whose markers are special tokens (harmony, [TOOL_CALLS]) reads them
            keep = getattr(seq.extras.get("stream_parser"), "keeps_special_tokens", False)
            seq.detokenizer = IncrementalDetokenizer(self.tokenizer, seq.prompt_ids, skip_special_tokens=not keep)
        previous = len(seq.text)
        seq.text += seq.detokenizer.push([token])
        stops = [s for s in seq.params.stop if s]
        if not stops:
            return False
        begin = max(0, previous - max(len(s) for s in stops) + 1)
        hits = [i for i in (seq.text.find(s, begin) for s in stops) if i >= 0]
        if hits:
            seq.text = seq.text[: min(hits)]
            return True
        return False

    def _flush(self, seq: Sequence) -> None:
        if seq.detokenizer is not None:
            seq.text += seq.detokenizer.flush()

    def _output(self, seq: Sequence, tokens: tuple[int, ...], logprob: tuple | None) -> RequestOutput:
        finished = seq.is_finished
        end = len(seq.text)
        if not finished and seq.params.stop:
            end -= held_back_len(seq.text, seq.params.stop)
        end = max(end, seq.num_text_emitted)
        delta = seq.text[seq.num_text_emitted : end]
        seq.num_text_emitted = end
        return RequestOutput(
            request_id=seq.request_id,
            new_token_ids=tokens,
            text_delta=delta,
            finished=finished,
            finish_reason=seq.finish_reason if finished else None,
            error=seq.error if finished else None,
            num_prompt_tokens=len(seq.prompt_ids),
            num_output_tokens=len(seq.output_ids),
            logprobs=logprob,
            parsed=_parse(seq, delta, finished),
        )
