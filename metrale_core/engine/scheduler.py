"""The scheduler: which sequences run each step, with which blocks and slots.

Owner: ``LLMEngine`` calls :meth:`Scheduler.schedule` once per step and hands the plan to the
model runner; the output processor then reports the step back through the scheduler's own
methods (:meth:`Scheduler.advance`, :meth:`Scheduler.finish`, :meth:`Scheduler.commit_verify`,
and :meth:`Scheduler.complete` once the step's outputs are processed).  The scheduler is the only
writer of its state (queues, blocks, slots, ``in_flight``); others call these methods.  The
*policy* (a ``SchedulerSpec`` plugin, built-in ``"fcfs"``; :mod:`metrale_core.engine.policy`) only
chooses which waiting sequence to admit next and which running sequence to preempt; the
bookkeeping below is the same for every policy.  The plan it returns is a
:class:`~metrale_core.engine.plan.SchedulerOutput` of
:class:`~metrale_core.engine.plan.ScheduledChunk` s (:mod:`metrale_core.engine.plan`).

One step, in order:
1. Expire requests past their deadline (``"timeout"``).
2. Running sequences, in admission order: a decoding one feeds its last sampled token; a partly
   prefilled one continues its prompt within the ``max_prefill_tokens`` budget (chunked
   prefill).  A sequence that cannot get a block preempts the policy's victim (FCFS: the most
   recently admitted not yet scheduled this step, possibly itself) by recompute: its blocks and
   slot are freed and it goes back to the FRONT of the waiting queue with prompt + generated
   tokens as its new prefill content.  A sequence alone in the pool that still cannot grow
   finishes with ``"error"`` (``KVCacheExhausted``).  Before that, a running sequence of a model
   with attention windows gives back the blocks that slid out of every window
   (``BlockManager.slide``), and its room counts one block per KV group for each block of
   positions, so admission and growth count a windowed group's smaller need.
3. If nothing was preempted, admit waiting sequences in policy order (continuous batching)
   while the budget, ``max_num_seqs``, the KV pool and the state slots allow (a policy whose
   ``next_waiting`` takes ``step`` also sees what the step holds, an :class:`AdmissionStep`).
   The policy may also end admission for this step by returning None from ``next_waiting`` (a hold-back;
   running sequences are unaffected), exactly as if its choice did not fit.  Guard: a None
   while nothing is running (so nothing was admitted this step either) would stall the
   engine, so then the queue front is admitted instead (and the policy is asked again for
   the next one).

Invariants:
- The plan lists decode rows first (running order), then prefill chunks (admission order).
- A chunk feeds tokens ``[num_computed_tokens, num_computed_tokens + n)``; nothing is ever fed
  twice and no step is re-run.  A replayed history samples only at its last position, so
  generated tokens are never resampled.
- The scheduler never touches tensors.
- A hold-back (None) never stalls the engine: with nothing running, the queue front is
  admitted instead, so an idle engine with waiting sequences always makes progress.
- Speculative decoding enters through one seam: a *draft source* (attached once with
  :meth:`Scheduler.attach_draft_source`; the engine's speculation driver) is asked for drafts at
  the start of each :meth:`Scheduler.schedule`; a decode row with a draft becomes a verify chunk
  that carries its ``Draft`` record (``ScheduledChunk.draft``).  Without one, nothing changes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any, Protocol, cast

from loguru import logger

from metrale_core.engine.adapter_key import adapter_of
from metrale_core.engine.block_manager import BlockManager
from metrale_core.engine.config import EngineConfig
from metrale_core.engine.plan import ScheduledChunk, SchedulerOutput
from metrale_core.engine.policy import AdmissionStep, SchedulingPolicy, StepAwarePolicy, takes_step
from metrale_core.engine.request import Sequence, SequenceStatus
from metrale_core.engine.state_slots import StateSlots
from metrale_core.errors import InvalidRequest, KVCacheExhausted
from metrale_core.model_api import ModelInfo
from metrale_core.sampling.position import PositionKind

__all__ = ["DraftSource", "Scheduler"]


class DraftSource(Protocol):
    """Where the scheduler gets drafts (the engine's speculation driver)."""

    def drafts(self) -> Mapping[str, Any]:
        """request id -> ``Draft`` for the running decode sequences of the step being planned."""
        ...


class Scheduler:
    """Waiting queue, running list, KV blocks and state slots of one engine."""

    def __init__(
        self, config: EngineConfig, info: ModelInfo, policy: SchedulingPolicy, num_blocks: int, max_model_len: int
    ) -> None:
        self.config = config
        self.policy = policy
        self.max_model_len = max_model_len
        self.block_manager = BlockManager(
            num_blocks,
            config.block_size,
            config.resolve_prefix_caching(info),
            windows=info.kv.groups.windows if info.kv is not None else (None,),
        )
        self.state_slots = StateSlots(config.num_state_slots_for(info), info.has_recurrent_state)
        #: Preemptions (by recompute) since start.
        self.num_preemptions = 0
        self.waiting: deque[Sequence] = deque()
        #: Admission order; the last is the most recently admitted.
        self.running: list[Sequence] = []
        self.seqs: dict[str, Sequence] = {}
        #: The plan handed to the runner whose outputs are not yet processed (None between
        #: steps); read it through ``in_flight``, cleared by :meth:`complete` /
        #: :meth:`take_in_flight`.
        self._in_flight: SchedulerOutput | None = None
        #: Asked for drafts at the start of each plan (see :meth:`attach_draft_source`).
        self._draft_source: DraftSource | None = None
        #: The most recent plan (for observers and tests).
        self.last_plan: SchedulerOutput = SchedulerOutput.make_empty()
        self._unreported: list[Sequence] = []
        #: The policy's ``next_waiting`` takes ``step`` (an ``AdmissionStep``).
        self._policy_takes_step = takes_step(policy)
        #: Most distinct LoRA adapters running at once (``--max-loras``; None: no limit).
        self.max_adapters: int | None = None

    # --- requests ----------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        if seq.request_id in self.seqs:
            raise InvalidRequest(f"request id {seq.request_id!r} is already in use")
        self.seqs[seq.request_id] = seq
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.seqs) or bool(self._unreported)

    def abort(self, request_id: str) -> bool:
        """Finish ``request_id`` with ``"abort"`` and free its blocks now; False if unknown."""
        seq = self.seqs.get(request_id)
        if seq is None:
            return False
        self.finish(seq, "abort", report=True)
        return True

    def finish(self, seq: Sequence, reason: str, error: str | None = None, report: bool = False) -> None:
        """Mark ``seq`` finished, free its blocks and slot; ``report`` queues it for the next plan."""
        if seq.is_finished:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        self.state_slots.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason, seq.error = reason, error
        self.seqs.pop(seq.request_id, None)
        if report:
            self._unreported.append(seq)

    # --- one step ----------------------------------------------------------------------------
    @property
    def in_flight(self) -> SchedulerOutput | None:
        """The plan whose outputs are not yet processed (None between steps)."""
        return self._in_flight

    def attach_draft_source(self, source: DraftSource) -> None:
        """Ask ``source.drafts()`` for drafts at the start of every :meth:`schedule`."""
        self._draft_source = source

    def schedule(self) -> SchedulerOutput:
        """Plan one step (see the module docstring).

        The draft source's drafts (request id -> ``Draft``) turn those decode rows into verify
        chunks ``[last, d1..dk]``; a draft is cut to the KV room left, so speculation never
        preempts.
        """
        drafts = self._draft_source.drafts() if self._draft_source is not None else {}
        self._expire()
        budget = self.config.max_prefill_tokens
        decodes: list[ScheduledChunk] = []
        prefills: list[ScheduledChunk] = []
        preempted: list[str] = []
        i = 0
        while i < len(self.running):
            seq = self.running[i]
            want = min(seq.num_prefill_tokens - seq.num_computed_tokens, budget) if seq.is_prefilling else 1
            if want == 0:
                i += 1
                continue
            self.block_manager.slide(seq)
            source = None if seq.is_prefilling else drafts.get(seq.request_id)
            draft = self._fit_draft(seq, source)
            n = self._reserve(seq, want + len(draft), i, preempted)
            if n == 0:  # seq itself was preempted or failed; running[i] is now the next one
                continue
            chunk = self._chunk(seq, n, draft, source)
            if chunk.is_decode:
                decodes.append(chunk)
            else:
                prefills.append(chunk)
                budget -= n
            i += 1
        if not preempted:
            budget = self._admit(budget, decodes, prefills)
        finished, self._unreported = tuple(self._unreported), []
        # the plan derives the step's row split (``plan.split``) here, once; the runner carries it
        plan = SchedulerOutput(tuple(decodes + prefills), tuple(preempted), finished)
        self._in_flight = plan if plan.chunks else None
        self.last_plan = plan
        return plan

    def complete(self, plan: SchedulerOutput) -> None:
        """The outputs of ``plan`` are processed: nothing is in flight any more."""
        if self._in_flight is plan:
            self._in_flight = None

    def take_in_flight(self) -> SchedulerOutput | None:
        """The plan in flight (None if none), which is no longer in flight afterwards (after a
        step raised, the engine fails its sequences)."""
        plan, self._in_flight = self._in_flight, None
        return plan

    def advance(self, plan: SchedulerOutput) -> None:
        """Record that the model consumed every chunk of ``plan`` (called once per plan)."""
        for chunk in plan.chunks:
            seq = chunk.seq
            if seq.is_finished:
                continue
            # a verify chunk's drafts count only once accepted (commit_verify)
            seq.num_computed_tokens = chunk.start + (1 if chunk.is_verify else chunk.num_tokens)
            self.block_manager.cache_full_blocks(seq)

    def commit_verify(self, chunk: ScheduledChunk, num_accepted: int) -> None:
        """After acceptance: keep the K/V of ``last, d1..d_num_accepted`` and roll the rest back
        (the sequence length drops, blocks past it are freed; only committed full blocks are
        hashed into the prefix cache)."""
        seq = chunk.seq
        if seq.is_finished:
            return
        seq.num_computed_tokens = chunk.start + 1 + num_accepted
        self.block_manager.truncate(seq, seq.num_computed_tokens)
        self.block_manager.cache_full_blocks(seq)

    # --- internals ---------------------------------------------------------------------------
    def _expire(self) -> None:
        now = self.config.clock()
        for seq in [*self.running, *self.waiting]:
            if seq.deadline is not None and now >= seq.deadline:
                logger.info("request {} timed out", seq.request_id)
                self.finish(seq, "timeout", report=True)

    def _reserve(self, seq: Sequence, want: int, index: int, preempted: list[str]) -> int:
        """Grow ``seq`` to hold ``want`` more tokens (fewer for a prefill chunk), preempting as
        needed; returns the tokens granted, 0 when ``seq`` itself was preempted or failed."""
        bm = self.block_manager
        while True:
            computed = seq.num_computed_tokens
            room = (len(seq.block_ids) + bm.num_free_blocks // bm.num_groups) * bm.block_size - computed
            n = min(want, room) if seq.is_prefilling else (want if room >= want else 0)
            if n > 0:
                bm.grow(seq, computed + n)
                return n
            victim = self.policy.choose_victim(self.running[index:])
            if victim is seq and len(self.running) == 1:
                self._fail_exhausted(seq, computed + want)
                return 0
            self._preempt(victim)
            preempted.append(victim.request_id)
            if victim is seq:
                return 0

    def _preempt(self, seq: Sequence) -> None:
        logger.debug("preempting {} (recompute of {} tokens)", seq.request_id, seq.num_tokens)
        self.running.remove(seq)
        self.block_manager.free(seq)
        self.state_slots.free(seq)
        seq.num_computed_tokens = 0
        seq.num_prefill_tokens = seq.num_tokens
        seq.num_preemptions += 1
        self.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)

    def _fail_exhausted(self, seq: Sequence, num_tokens: int) -> None:
        bm = self.block_manager
        error = KVCacheExhausted(
            f"request {seq.request_id!r} needs {bm.min_blocks_for(num_tokens)} KV blocks of "
            f"{bm.block_size} tokens for {num_tokens} tokens, but the whole pool holds "
            f"{bm.num_blocks} blocks; raise kv_cache_memory / num_kv_blocks or lower "
            f"max_tokens / max_model_len"
        )
        logger.warning("{}", error)
        self.finish(seq, "error", error=str(error), report=True)

    def _admit(self, budget: int, decodes: list[ScheduledChunk], prefills: list[ScheduledChunk]) -> int:
        bm = self.block_manager
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self._next_waiting(budget, decodes, prefills)
            if seq is None:
                break
            if bm.min_blocks_for(seq.num_prefill_tokens) > bm.num_blocks:
                self._fail_exhausted(seq, seq.num_prefill_tokens)
                continue
            if not self.state_slots.can_allocate() or not self._adapter_fits(seq):
                break
            hits = [] if seq.pools else bm.match_prefix(seq)
            cached = len(hits) * bm.block_size
            n = min(seq.num_prefill_tokens - cached, budget)
            if not bm.can_allocate(hits, cached + n):
                break
            self.waiting.remove(seq)
            bm.allocate(seq, hits, cached + n)
            self.state_slots.allocate(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            prefills.append(self._chunk(seq, n))
            budget -= n
        return budget

    def _adapter_fits(self, seq: Sequence) -> bool:
        """Admitting ``seq`` keeps the running adapters within ``max_adapters``."""
        key = adapter_of(seq)
        if self.max_adapters is None or key is None:
            return True
        running = {adapter_of(s) for s in self.running} - {None}
        return key in running or len(running) < self.max_adapters

    def _next_waiting(
        self, budget: int, decodes: list[ScheduledChunk], prefills: list[ScheduledChunk]
    ) -> Sequence | None:
        """The policy's choice; None (a hold-back) only while something is running."""
        if self._policy_takes_step:
            step = AdmissionStep(
                num_decodes=len(decodes),
                num_decode_tokens=sum(c.num_tokens for c in decodes),
                num_prefill_tokens=sum(c.num_tokens for c in prefills),
                budget=budget,
            )
            seq = cast(StepAwarePolicy, self.policy).next_waiting(self.waiting, step=step)  # _takes_step
        else:
            seq = self.policy.next_waiting(self.waiting)
        if seq is None and not self.running:
            # nothing running and nothing admitted this step: holding back would stall forever
            logger.debug("policy held back admission with nothing running; admitting {}", self.waiting[0].request_id)
            return self.waiting[0]
        return seq

    def _fit_draft(self, seq: Sequence, draft: Any) -> tuple[int, ...]:
        """The draft tokens that fit the KV room left without preempting anyone."""
        if draft is None or not draft.token_ids:
            return ()
        bm = self.block_manager
        room = (len(seq.block_ids) + bm.num_free_blocks // bm.num_groups) * bm.block_size - seq.num_computed_tokens
        return tuple(draft.token_ids[: max(0, room - 1)])

    def _chunk(self, seq: Sequence, n: int, draft: tuple[int, ...] = (), source: Any = None) -> ScheduledChunk:
        start = seq.num_computed_tokens
        if draft:
            return ScheduledChunk(
                seq=seq,
                start=start,
                token_ids=(seq.token_ids(start, start + 1) + draft),
                block_ids=tuple(seq.block_ids),
                state_slot=seq.state_slot,
                sample=True,
                kind=PositionKind.VERIFY,
                is_decode=True,
                draft=source,
                group_block_ids=_group_tables(seq),
            )
        sample = start + n == seq.num_tokens
        kind = None
        if sample:
            kind = PositionKind.FINAL_DECODE if seq.output_ids else PositionKind.PREFILL_LAST
        return ScheduledChunk(
            seq=seq,
            start=start,
            token_ids=seq.token_ids(start, start + n),
            block_ids=tuple(seq.block_ids),
            state_slot=seq.state_slot,
            sample=sample,
            kind=kind,
            is_decode=not seq.is_prefilling,
            group_block_ids=_group_tables(seq),
        )


def _group_tables(seq: Sequence) -> tuple[tuple[int, ...], ...]:
    """The block tables of ``seq``'s KV groups after the first (empty without windows)."""
    return tuple(tuple(table) for table in seq.group_block_ids)
