"""The speculation seam: ``SpecDriver`` (a speculator is configured) or ``NULL_SPECULATION``.

Owner: ``LLMEngine`` builds one driver (``build_spec_driver``) and calls
:meth:`SpecDriver.after_step` after every step's outputs are processed; the scheduler asks the
driver for drafts at the start of each plan (the driver attaches itself with
``Scheduler.attach_draft_source``), and a driver whose speculator wants hidden states turns on
``ModelRunner.keep_hidden_states``.  So ``LLMEngine.step`` is one path (schedule -> execute ->
update -> after_step) with or without speculation.  With :data:`NULL_SPECULATION` nothing here
runs and the engine behaves (and traces) exactly as without speculation.

Invariants:
- Drafts are asked only for running sequences that are decoding (not prefilling) and did not opt
  out (``seq.extras["speculative"] is False``); each is capped so that the verify chunk neither
  generates past ``max_tokens`` nor feeds a position at or past ``max_model_len``, and trimmed to
  the prefix the logit pipeline's processors accept (``LogitPipeline.draft_prefix``: a grammar).
- After a step with verify chunks of a recurrent model, ``ModelRunner.commit_verify`` runs
  before anything else can feed the model (the next ``schedule`` / ``execute``).
- The speculator sees every non-empty step (``observe``), prefill-only steps included, so an MTP
  head can follow the target's hidden states.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loguru import logger

from metrale_core.engine.speculation import (
    SPECULATIVE_EXTRA,
    Draft,
    ProposerContext,
    StepReport,
)
from metrale_core.errors import ConfigError

if TYPE_CHECKING:
    from metrale_core.plugin.registry import Registry

__all__ = ["NULL_SPECULATION", "NullSpeculation", "SpecDriver", "build_spec_driver"]


class NullSpeculation:
    """The driver when speculation is off: the step is plain decoding."""

    speculator = None
    enabled = False

    def after_step(self, plan: Any, outputs: list, outcomes: tuple = (), hidden: Any = None) -> None:
        return None

    def __repr__(self) -> str:
        return "NullSpeculation()"


NULL_SPECULATION = NullSpeculation()


class SpecDriver:
    """Asks the speculator for drafts (as the scheduler's draft source) and reports each step
    back to it."""

    enabled = True

    def __init__(
        self, speculator: Any, scheduler: Any, runner: Any, output_processor: Any, max_model_len: int, clock: Any = None
    ) -> None:
        self.speculator = speculator
        self.scheduler = scheduler
        self.runner = runner
        self.output_processor = output_processor
        self.max_model_len = max_model_len
        self.clock = clock if clock is not None else scheduler.config.clock
        #: Engine-clock time the current step began (when its drafts were asked for).
        self._started = 0.0
        scheduler.attach_draft_source(self)
        if self.wants_hidden:
            runner.keep_hidden_states()

    @property
    def wants_hidden(self) -> bool:
        return bool(getattr(self.speculator, "wants_hidden", False))

    def drafts(self) -> dict[str, Draft]:
        """request id -> draft for this step's decode rows (empty drafts left out); called by
        the scheduler at the start of each plan, which is when the step's timing starts."""
        self._started = self.clock()
        seqs, caps = [], []
        for seq in self.scheduler.running:
            if seq.is_prefilling or seq.extras.get(SPECULATIVE_EXTRA, True) is False:
                continue
            cap = min(seq.params.max_tokens - len(seq.output_ids) - 1, self.max_model_len - seq.num_tokens)
            seqs.append(seq)
            caps.append(max(0, cap))
        if not seqs:
            return {}
        proposals = self.speculator.propose(seqs, caps)
        drafts = {}
        valid = getattr(getattr(self.output_processor, "pipeline", None), "draft_prefix", None)
        for seq, cap, draft in zip(seqs, caps, proposals):
            if draft is not None and draft.token_ids and cap > 0:
                draft = draft.truncated(cap)
                if valid is not None:  # a grammar's valid prefix: the rest would be rejected
                    draft = draft.truncated(valid(seq, draft.token_ids))
                if draft.token_ids:
                    drafts[seq.request_id] = draft
        return drafts

    def after_step(self, plan: Any, outputs: list, outcomes: tuple = (), hidden: Any = None) -> None:
        """Roll recurrent state back to the committed rows, then report the step (``outcomes``:
        its verify chunks' ``VerifyOutcome`` records; ``hidden``: its hidden states, kept when
        the speculator wants them)."""
        duration_s = self.clock() - self._started
        accepted = {o.request_id: o.num_accepted for o in outcomes if not o.finished}
        verify_chunks = [c for c in plan.chunks if c.is_verify and c.seq.request_id in accepted]
        if verify_chunks:
            self.runner.commit_verify(
                [c.state_slot for c in verify_chunks], [1 + accepted[c.seq.request_id] for c in verify_chunks]
            )
        if plan.is_empty:
            return
        emitted = {o.request_id: len(o.new_token_ids) for o in outputs}
        decode = plan.decode_chunks
        committed = {}
        for chunk in plan.chunks:
            rid = chunk.seq.request_id
            if chunk.seq.is_finished:
                continue
            committed[rid] = 1 + accepted[rid] if chunk.is_verify else chunk.num_tokens
        self.speculator.observe(
            StepReport(
                num_decode_seqs=len(decode),
                outcomes=outcomes,
                num_emitted=sum(emitted.get(c.seq.request_id, 0) for c in decode),
                num_prefill_tokens=plan.num_prefill_tokens,
                duration_s=duration_s,
                plan=plan,
                hidden=hidden,
                committed_rows=committed,
            )
        )


def build_spec_driver(
    config: Any,
    model: Any,
    pipeline: Any,
    registry: Registry | None,
    scheduler: Any,
    runner: Any,
    output_processor: Any,
    max_model_len: int,
    speculator: Any = None,
) -> SpecDriver | NullSpeculation:
    """The driver of ``speculator`` (a ``Speculator``, or a factory ``f(ProposerContext)`` like
    ``ProposerSpec.factory``), else of the proposer named by the ``speculative`` plugin option
    (``--speculative``); :data:`NULL_SPECULATION` when speculation is off."""
    ctx = ProposerContext(config=config, model=model, pipeline=pipeline, registry=registry, max_model_len=max_model_len)
    if speculator is None:
        name = config.plugin_options.get("speculative")
        if not name:
            return NULL_SPECULATION
        if registry is None:
            raise ConfigError(
                f"speculative decoding with {name!r} needs the plugin registry; "
                "build the engine with registry=load_registry()"
            )
        speculator = registry.get("proposers", name).factory(ctx)
    elif not hasattr(speculator, "propose"):
        speculator = speculator(ctx)
    if model.info.has_recurrent_state and not hasattr(model, "commit_verify"):
        raise ConfigError(
            f"{model.info.architecture} keeps recurrent state but implements no "
            "commit_verify(state, slots, num_kept), so rejected drafts cannot be "
            "rolled back; run it without speculative decoding"
        )
    if getattr(speculator, "wants_hidden", False) and not hasattr(model, "forward_with_hidden"):
        raise ConfigError(
            f"the {type(speculator).__name__} proposer needs the target's hidden "
            f"states, but {model.info.architecture} has no forward_with_hidden"
        )
    logger.info("speculative decoding on: {}", speculator)
    return SpecDriver(speculator, scheduler, runner, output_processor, max_model_len, clock=config.clock)
