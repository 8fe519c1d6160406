"""``SlaiPolicy``: deadline-aware shortest-prompt-first admission with aging.

Owner: ``SchedulerSpec("slai").factory(engine_config)`` builds one per engine; the engine's
scheduler calls :meth:`SlaiPolicy.next_waiting` while it admits and :meth:`choose_victim` when
the KV pool is full (the ``metrale_core.engine.SchedulingPolicy`` protocol).

Admission order (one call picks one sequence; the scheduler stops when it does not fit):
1. a preempted sequence (it already streamed tokens), fewest tokens first;
2. a *due* sequence: waited ``max_wait_s``, or its deadline is within ``deadline_slack_s``;
   earliest due time first;
3. the shortest prefill, ties in arrival order.

Invariants:
- Pure: reads the sequences and the engine clock, keeps no state between calls, so a trace is
  a function of the requests and the clock.
- Every choice is one of the sequences it was given; ties fall back to arrival order, so the
  order is total and deterministic.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence as Seq

from attrs import field, frozen

from metrale_core.errors import ConfigError

__all__ = ["SlaiPolicy"]


def _non_negative(instance, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ConfigError(f"slai: {attribute.name} must be a number >= 0, got {value!r}")


@frozen
class SlaiPolicy:
    """See the module docstring."""

    #: Seconds after which a waiting sequence is due (admitted before shorter ones).
    max_wait_s: float = field(default=5.0, validator=_non_negative)
    #: A sequence is due this many seconds before its deadline.
    deadline_slack_s: float = field(default=1.0, validator=_non_negative)
    #: The engine's clock (``EngineConfig.clock``), in the units of ``Request.arrival_time``.
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    @classmethod
    def from_config(cls, config: Any) -> "SlaiPolicy":
        """Build from an ``EngineConfig``: its clock and the ``--slai-*`` plugin options."""
        from metrale_slai import DEFAULT_DEADLINE_SLACK_MS, DEFAULT_MAX_WAIT_MS

        if config is None:
            return cls(DEFAULT_MAX_WAIT_MS / 1000, DEFAULT_DEADLINE_SLACK_MS / 1000)
        options = config.plugin_options
        return cls(
            max_wait_s=options.get("slai_max_wait_ms", DEFAULT_MAX_WAIT_MS) / 1000,
            deadline_slack_s=options.get("slai_deadline_slack_ms", DEFAULT_DEADLINE_SLACK_MS) / 1000,
            clock=config.clock,
        )

    def due_time(self, seq: Any) -> float:
        """When ``seq`` stops waiting its turn: aged out, or close to its deadline."""
        due = seq.request.arrival_time + self.max_wait_s
        if seq.deadline is not None:
            due = min(due, seq.deadline - self.deadline_slack_s)
        return due

    def next_waiting(self, waiting: Seq[Any]) -> Any:
        resumed = [seq for seq in waiting if seq.num_preemptions > 0]
        if resumed:
            return min(resumed, key=lambda seq: (seq.num_prefill_tokens, seq.order))
        now = self.clock()
        due = [seq for seq in waiting if self.due_time(seq) <= now]
        if due:
            return min(due, key=lambda seq: (self.due_time(seq), seq.order))
        return min(waiting, key=lambda seq: (seq.num_prefill_tokens, seq.order))

    def choose_victim(self, candidates: Seq[Any]) -> Any:
        # max() keeps the first of equal keys: walk from the most recently admitted
        return max(reversed(candidates), key=lambda seq: len(seq.block_ids))
