"""``SlaiPolicy``: deadline-aware shortest-prompt-first admission with aging.

Owner: ``SchedulerSpec("slai").factory(engine_config)`` builds one per engine; the engine's
scheduler calls :meth:`SlaiPolicy.next_waiting` while it admits and :meth:`choose_victim` when
the KV pool is full (the ``metrale_core.engine.SchedulingPolicy`` protocol).

Admission order (one call picks one sequence; the scheduler stops when it does not fit):
1. a preempted sequence (it already streamed tokens), fewest tokens first;
2. a *due* sequence: waited ``max_wait_s``, or its deadline is within ``deadline_slack_s``;
   earliest due time first;
3. the shortest prefill, ties in arrival order -- unless the TBT hold-back applies, and then
   None: no new prefill this step.

TBT hold-back (off while ``tbt_budget_s`` is 0): while the step has decode rows, a sequence of
rule 3 is held back when the estimated step time would exceed ``tbt_budget_s``, so the decoding
sequences keep their time between tokens.  The cost model is linear in the tokens the step
feeds: ``(decode tokens + prefill tokens already scheduled + the candidate's first chunk) /
step_tokens_per_s``, the first chunk being ``min(its prefill tokens, the budget left)`` (a
prefix-cache hit is ignored, so the estimate errs long).  Rule 3's pick is the shortest, so
when it is held back every other fresh sequence would be too.  Preempted and due sequences
are never held back (aging bounds how long a long prompt can be held back), nor is anything
when no sequence is decoding.

Invariants:
- Pure: reads the sequences, the scheduler's ``AdmissionStep`` and the engine clock, keeps no
  state between calls, so a trace is a function of the requests and the clock.
- Every choice is one of the sequences it was given, or None (a hold-back, only with decode
  rows in the step); ties fall back to arrival order, so the order is total and deterministic.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from typing import Any

from attrs import field, frozen

from metrale_core.api import ConfigError

__all__ = ["SlaiPolicy"]


def _non_negative(instance, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ConfigError(f"slai: {attribute.name} must be a number >= 0, got {value!r}")


def _positive(instance, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ConfigError(f"slai: {attribute.name} must be a number > 0, got {value!r}")


@frozen
class SlaiPolicy:
    """See the module docstring."""

    #: Seconds after which a waiting sequence is due (admitted before shorter ones).
    max_wait_s: float = field(default=5.0, validator=_non_negative)
    #: A sequence is due this many seconds before its deadline.
    deadline_slack_s: float = field(default=1.0, validator=_non_negative)
    #: The engine's clock (``EngineConfig.clock``), in the units of ``Request.arrival_time``.
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    #: Hold back new prefills that would make a step with decodes longer than this (0 = never).
    tbt_budget_s: float = field(default=0.0, validator=_non_negative)
    #: The hold-back's cost model: tokens one step feeds per second.
    step_tokens_per_s: float = field(default=10_000.0, validator=_positive)

    @classmethod
    def from_config(cls, config: Any) -> SlaiPolicy:
        """Build from an ``EngineConfig``: its clock and the ``--slai-*`` plugin options."""
        from metrale_slai import (
            DEFAULT_DEADLINE_SLACK_MS,
            DEFAULT_MAX_WAIT_MS,
            DEFAULT_STEP_TOKENS_PER_MS,
            DEFAULT_TBT_BUDGET_MS,
        )

        if config is None:
            return cls(DEFAULT_MAX_WAIT_MS / 1000, DEFAULT_DEADLINE_SLACK_MS / 1000)
        options = config.plugin_options
        return cls(
            max_wait_s=options.get("slai_max_wait_ms", DEFAULT_MAX_WAIT_MS) / 1000,
            deadline_slack_s=options.get("slai_deadline_slack_ms", DEFAULT_DEADLINE_SLACK_MS) / 1000,
            clock=config.clock,
            tbt_budget_s=options.get("slai_tbt_budget_ms", DEFAULT_TBT_BUDGET_MS) / 1000,
            step_tokens_per_s=options.get("slai_step_tokens_per_ms", DEFAULT_STEP_TOKENS_PER_MS) * 1000,
        )

    def due_time(self, seq: Any) -> float:
        """When ``seq`` stops waiting its turn: aged out, or close to its deadline."""
        due = seq.request.arrival_time + self.max_wait_s
        if seq.deadline is not None:
            due = min(due, seq.deadline - self.deadline_slack_s)
        return due

    def step_time_s(self, seq: Any, step: Any) -> float:
        """The cost model: seconds the step would take if ``seq`` were admitted now."""
        first_chunk = min(seq.num_prefill_tokens, step.budget)
        tokens = step.num_decode_tokens + step.num_prefill_tokens + first_chunk
        return tokens / self.step_tokens_per_s

    def holds_back(self, seq: Any, step: Any) -> bool:
        """Whether admitting ``seq`` would push a step with decodes past the TBT budget."""
        if not self.tbt_budget_s or step is None or step.num_decodes == 0:
            return False
        return self.step_time_s(seq, step) > self.tbt_budget_s

    def next_waiting(self, waiting: Seq[Any], step: Any = None) -> Any:
        resumed = [seq for seq in waiting if seq.num_preemptions > 0]
        if resumed:
            return min(resumed, key=lambda seq: (seq.num_prefill_tokens, seq.order))
        now = self.clock()
        due = [seq for seq in waiting if self.due_time(seq) <= now]
        if due:
            return min(due, key=lambda seq: (self.due_time(seq), seq.order))
        shortest = min(waiting, key=lambda seq: (seq.num_prefill_tokens, seq.order))
        return None if self.holds_back(shortest, step) else shortest

    def choose_victim(self, candidates: Seq[Any]) -> Any:
        # max() keeps the first of equal keys: walk from the most recently admitted
        return max(reversed(candidates), key=lambda seq: len(seq.block_ids))
