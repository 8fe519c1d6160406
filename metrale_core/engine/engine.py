"""``LLMEngine``: the synchronous engine: add requests, step, read deltas.

Owner: the CLI (``met generate``) drives it directly; ``AsyncEngine`` drives it from its own
thread for the HTTP server.  It wires the parts once at construction: the scheduling policy, the
sampler and the logit processors are resolved from the plugin registry here, never per token.

Invariants:
- ``step()`` is schedule -> execute -> update -> the speculation driver's ``after_step``, one
  path with or without speculation (``engine.speculation`` is the null driver when it is off;
  drafts reach the scheduler through its draft source); a step is never re-run.
- ``validate_request`` refuses what can never run (empty prompt, a prompt that leaves no room for
  one output token, token ids outside the vocabulary, parameters a logit processor refuses) with a
  ``RequestError`` and otherwise returns the ``EngineRequest`` record; ``add_request`` queues such
  a record without checking it again (a request is validated once), refusing only a reused id.
- ``abort`` frees the request's blocks at once; its final delta (``"abort"``) comes with the
  next ``step()``.
- Not thread-safe: one thread calls every method (``AsyncEngine`` keeps that rule).
- With a plugin registry, the last step of ``__init__`` calls the ``metrale_engine_started``
  hook through ``Registry.announce_engine_started`` (each plugin on its own; one that raises is
  logged and skipped).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Any, overload

from attrs import frozen
from loguru import logger

from metrale_core.engine.config import EngineConfig
from metrale_core.engine.deltas import RequestOutput
from metrale_core.engine.kv_dtype import resolve_kv_storage
from metrale_core.engine.output import OutputProcessor
from metrale_core.engine.policy import FcfsPolicy
from metrale_core.engine.pooling import plan_pools, pool_step
from metrale_core.engine.request import EngineRequest, Request, Sequence
from metrale_core.engine.runner import ModelRunner, model_device
from metrale_core.engine.scheduler import Scheduler
from metrale_core.engine.snapshot import SnapshotPublisher
from metrale_core.engine.spec_driver import SpecDriver, build_spec_driver
from metrale_core.errors import ConfigError, InvalidRequest, PromptTooLong
from metrale_core.model_api import CausalLM
from metrale_core.sampling.params import SamplingParams

if TYPE_CHECKING:
    from metrale_core.plugin.registry import Registry

__all__ = ["EngineStats", "LLMEngine", "announce_engine_started", "build_pipeline"]


@frozen
class EngineStats:
    """A snapshot of the engine's queues and pools (for dashboards and tests)."""

    num_running: int
    num_waiting: int
    num_free_blocks: int
    num_blocks: int
    num_cached_blocks: int
    num_free_state_slots: int
    #: Preemptions (by recompute) since start.
    num_preemptions: int = 0


def _component(family: dict, name: str, what: str) -> Any:
    spec = family.get(name)
    if spec is None:
        known = ", ".join(sorted(family)) or "none"
        raise ConfigError(f"no {what} named {name!r} is installed (installed: {known})")
    return spec


def build_pipeline(config: EngineConfig, registry: Registry | None = None) -> Any:
    """The ``LogitPipeline`` of the configured sampler and the enabled logit processors."""
    from metrale_core.sampling import DefaultSampler, LogitPipeline

    if registry is None:
        return LogitPipeline(processors=[], sampler=DefaultSampler())
    sampler = _component(registry.samplers, config.sampler, "sampler").factory()
    specs = sorted(
        (s for s in registry.logit_processors.values() if s.default_enabled), key=lambda s: (s.order, s.name)
    )
    built = [(spec, spec.factory(config)) for spec in specs]
    # a factory returns None when the configuration leaves its processor off (e.g. a flag at 0)
    return LogitPipeline(processors=[(s, p) for s, p in built if p is not None], sampler=sampler)


def _build_policy(config: EngineConfig, registry: Registry | None) -> Any:
    if registry is None:
        if config.scheduler != "fcfs":
            raise ConfigError(
                f"scheduler {config.scheduler!r} needs the plugin registry; only 'fcfs' is available without one"
            )
        return FcfsPolicy(config)
    return _component(registry.schedulers, config.scheduler, "scheduler").factory(config)


def announce_engine_started(engine: Any, registry: Registry | None) -> None:
    """Call each plugin's ``metrale_engine_started(engine)`` through the registry's facade (one
    that raises is logged and skipped); nothing without a registry."""
    if registry is not None:
        registry.announce_engine_started(engine)


class LLMEngine:
    """One model, one scheduler, one KV cache."""

    def __init__(
        self,
        model: CausalLM,
        config: EngineConfig | None = None,
        tokenizer: Any = None,
        registry: Registry | None = None,
        *,
        speculator: Any = None,
    ) -> None:
        self.model = model
        self.config = config = config if config is not None else EngineConfig()
        self.tokenizer = tokenizer
        info = model.info
        self.max_model_len = config.resolve_max_model_len(info)
        if info.has_recurrent_state and config.enable_prefix_caching:
            logger.warning("prefix caching is off: {} keeps recurrent state outside the KV cache", info.architecture)
        #: The KV pool's storage layout (storage dtype) and codec (``--kv-cache-dtype``).
        self.kv_storage = resolve_kv_storage(config, model, registry, model_device(model))
        num_blocks = config.num_blocks_for(self.kv_storage.layout, self.max_model_len)
        self.scheduler = Scheduler(config, info, _build_policy(config, registry), num_blocks, self.max_model_len)
        self.runner = ModelRunner(
            model, num_blocks, config.block_size, self.scheduler.state_slots.num_slots, kv_storage=self.kv_storage
        )
        self.output_processor = OutputProcessor(
            build_pipeline(config, registry), self.scheduler, tokenizer, info.eos_token_ids, self.max_model_len
        )
        self._order = itertools.count()
        #: The speculation seam (``NULL_SPECULATION`` when off): a given ``speculator``, or the
        #: proposer named by the ``speculative`` plugin option (``--speculative``), built from
        #: the registry.
        self.speculation = build_spec_driver(
            config,
            model,
            self.output_processor.pipeline,
            registry,
            self.scheduler,
            self.runner,
            self.output_processor,
            self.max_model_len,
            speculator,
        )
        #: Publishes an immutable ``EngineSnapshot`` each step (``engine.snapshots.latest``).
        self.snapshots = SnapshotPublisher(self.scheduler, config.clock)
        logger.info(
            "engine: {} KV blocks x {} tokens, max_model_len {}, prefix caching {}",
            num_blocks,
            config.block_size,
            self.max_model_len,
            "on" if self.scheduler.block_manager.enable_prefix_caching else "off",
        )
        announce_engine_started(self, registry)

    @property
    def spec_driver(self) -> SpecDriver | None:
        """The speculation driver, or None when speculation is off."""
        return self.speculation if isinstance(self.speculation, SpecDriver) else None  # NullSpeculation: off

    # --- requests ----------------------------------------------------------------------------
    def validate_request(
        self,
        request_id: str,
        prompt_ids: Seq[int],
        params: SamplingParams,
        *,
        timeout_s: float | None = None,
        extras: dict | None = None,
    ) -> EngineRequest:
        """The checked record of one request, to hand to ``add_request`` (here, on the engine
        thread or in a replica: it is not checked again); raises ``InvalidRequest`` /
        ``PromptTooLong`` for a request that can never run.

        Checks the id, the prompt (not empty, room for one output token, ids in the vocabulary),
        ``params`` against the logit processors (e.g. a structured-output grammar compiles),
        ``timeout_s`` and ``extras``.  Reads only the configuration (and the processors'
        ``validate_params``, which must be thread-safe), so any thread may call it.
        """
        if not isinstance(request_id, str) or not request_id:
            raise InvalidRequest(f"request_id must be a non-empty string, got {request_id!r}")
        if not isinstance(params, SamplingParams):
            raise InvalidRequest(f"params must be SamplingParams, got {type(params).__name__}")
        check = getattr(self.output_processor.pipeline, "validate", None)
        if check is not None:  # the logit processors' own checks (a structured-output grammar)
            check(params)
        if len(prompt_ids) == 0:
            raise InvalidRequest(f"request {request_id!r}: the prompt is empty")
        if len(prompt_ids) + 1 > self.max_model_len:
            raise PromptTooLong(
                f"request {request_id!r}: the prompt has {len(prompt_ids)} tokens; with one output "
                f"token that exceeds max_model_len={self.max_model_len}; shorten the prompt"
            )
        vocab = self.model.info.vocab_size
        ids: list[int] = []
        for t in prompt_ids:
            try:
                token: int | None = operator.index(t) if not isinstance(t, bool) else None
            except TypeError:
                token = None
            if token is None or not 0 <= token < vocab:
                raise InvalidRequest(f"request {request_id!r}: token id {t!r} is outside the vocabulary [0, {vocab})")
            ids.append(token)
        if timeout_s is not None and not timeout_s > 0:
            raise InvalidRequest(f"request {request_id!r}: timeout_s must be > 0, got {timeout_s!r}")
        if extras is not None and not isinstance(extras, dict):
            raise InvalidRequest(f"request {request_id!r}: extras must be a dict, got {type(extras).__name__}")
        return EngineRequest(request_id, ids, params, timeout_s=timeout_s, extras=extras)

    @overload
    def add_request(self, request: EngineRequest) -> None: ...

    @overload
    def add_request(
        self,
        request: str,
        prompt_ids: Seq[int],
        params: SamplingParams,
        *,
        timeout_s: float | None = None,
        extras: dict | None = None,
    ) -> None: ...

    def add_request(
        self,
        request: EngineRequest | str,
        prompt_ids: Seq[int] | None = None,
        params: SamplingParams | None = None,
        *,
        timeout_s: float | None = None,
        extras: dict | None = None,
    ) -> None:
        """Queue a request; its deltas come from later ``step()`` calls.

        ``request`` is an ``EngineRequest`` from :meth:`validate_request` (queued as it is), or
        a request id followed by the prompt, the params and optionally ``timeout_s`` and
        ``extras``, which are checked first (:meth:`validate_request`).  ``extras`` is merged into
        the sequence's per-sequence plugin state (``seq.extras``), e.g.
        ``{"stream_parser": make_stream_parser(...)}`` (see ``metrale_core.streamparse``).
        """
        if not isinstance(request, EngineRequest):
            prompt = () if prompt_ids is None else prompt_ids
            request = self.validate_request(request, prompt, params, timeout_s=timeout_s, extras=extras)  # type: ignore[arg-type]
        request_id = request.request_id
        if request_id in self.scheduler.seqs:
            raise InvalidRequest(f"request id {request_id!r} is already in use")
        now = self.config.clock()
        limit = request.timeout_s if request.timeout_s is not None else self.config.request_timeout_s
        accepted = Request(
            request_id,
            request.prompt_ids,
            request.params,
            arrival_time=now,
            deadline=None if limit is None else now + limit,
        )
        seq = Sequence(accepted, next(self._order))
        seq.extras.update(request.extras or {})
        self.scheduler.add(seq)
        self.snapshots.request_added(request_id, now)

    def abort(self, request_id: str) -> bool:
        """Finish ``request_id`` with ``"abort"``, freeing its blocks now; False if unknown."""
        return self.scheduler.abort(request_id)

    def has_unfinished(self) -> bool:
        """True while a request is queued, running, or has a final delta not yet returned."""
        return self.scheduler.has_unfinished()

    # --- the loop ----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one step; returns the deltas it produced."""
        plan = self.scheduler.schedule()  # asks the speculation driver for drafts, if any
        pooling = plan_pools(plan)  # embedding rows need the step's hidden states
        self.output_processor.prepare(plan)  # processors may overlap work with the forward
        result = self.runner.execute(plan, hidden=pooling)
        pooled = pool_step(self, plan, result.hidden) if pooling else []
        update = self.output_processor.update(plan, result.logits)
        outputs = pooled + update.outputs
        # rollback + report; nothing when off
        self.speculation.after_step(plan, outputs, update.verify_outcomes, result.hidden)
        self.snapshots.publish(plan, outputs)
        return outputs

    def fail_in_flight(self, error: str) -> list[RequestOutput]:
        """After a step raised: finish the sequences of the failed step with ``"error"``.

        When no plan was in flight (the failure was in planning) every running sequence is
        failed.  Returns their final deltas.
        """
        plan = self.scheduler.take_in_flight()
        seqs = [c.seq for c in plan.chunks] if plan is not None else list(self.scheduler.running)
        outputs = []
        for seq in seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq, "error", error=error)
                outputs.append(self.output_processor.final_output(seq))
        self.snapshots.publish(None, outputs)
        return outputs

    def stats(self) -> EngineStats:
        bm = self.scheduler.block_manager
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_free_blocks=bm.num_free_blocks,
            num_blocks=bm.num_blocks,
            num_cached_blocks=bm.num_cached_blocks(),
            num_free_state_slots=self.scheduler.state_slots.num_free,
            num_preemptions=self.scheduler.num_preemptions,
        )
