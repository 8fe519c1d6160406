"""Scheduling policies: which waiting sequence the scheduler admits next and which running one
it preempts.

Owner: ``metrale_core.engine``; a ``SchedulerSpec`` plugin's factory returns a
:class:`SchedulingPolicy` (built-in ``"fcfs"``: :class:`FcfsPolicy`); the
:class:`~metrale_core.engine.scheduler.Scheduler` asks it and does all the bookkeeping.

Invariants:
- A policy only chooses; it never changes a queue, a block or a sequence.
- ``next_waiting`` receives an :class:`AdmissionStep` only when it declares a parameter named
  ``step`` (:func:`takes_step`, checked once when the scheduler is built).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence as Seq
from typing import Any, Protocol

from attrs import frozen

from metrale_core.engine.config import EngineConfig
from metrale_core.engine.request import Sequence

__all__ = ["AdmissionStep", "FcfsPolicy", "SchedulingPolicy", "StepAwarePolicy", "takes_step"]


@frozen
class AdmissionStep:
    """What the step being planned already holds when the policy picks a waiting sequence.

    Passed as ``next_waiting(waiting, step=...)`` to a policy whose ``next_waiting`` declares
    a parameter named ``step``; other policies are called as ``next_waiting(waiting)``.
    """

    #: Decode rows scheduled this step (sequences decoding; a verify chunk counts as one).
    num_decodes: int
    #: Tokens those decode rows feed (1 each, ``1 + k`` for a verify chunk of ``k`` drafts).
    num_decode_tokens: int
    #: Prefill tokens scheduled so far this step (continued chunked prefills, then the
    #: sequences admitted earlier this step).
    num_prefill_tokens: int
    #: Prefill tokens left in this step's ``max_prefill_tokens`` budget: a sequence admitted
    #: now gets a first chunk of at most this many tokens (fewer on a prefix-cache hit).
    budget: int


class SchedulingPolicy(Protocol):
    """What a ``SchedulerSpec.factory(config)`` returns.

    ``next_waiting`` may be declared as ``next_waiting(self, waiting, step=None)`` to receive
    an :class:`AdmissionStep` (the scheduler checks the signature once, at construction).
    """

    def next_waiting(self, waiting: Seq[Sequence]) -> Sequence | None:
        """The waiting sequence to try to admit next (admission stops when it does not fit),
        or None to admit no more waiting sequences this step (a hold-back: running sequences
        are unaffected; the policy is asked again next step).  ``waiting`` is never empty.
        Guard: when nothing is running, None would stall the engine, so the scheduler then
        admits the queue front (``waiting[0]``) instead."""
        ...

    def choose_victim(self, candidates: Seq[Sequence]) -> Sequence:
        """The sequence to preempt among ``candidates`` (running, not yet scheduled this step,
        in admission order; the first one is the sequence that needs room)."""
        ...


class StepAwarePolicy(SchedulingPolicy, Protocol):
    """A ``SchedulingPolicy`` whose ``next_waiting`` takes the :class:`AdmissionStep`."""

    def next_waiting(self, waiting: Seq[Sequence], step: AdmissionStep | None = None) -> Sequence | None: ...


@frozen
class FcfsPolicy:
    """First come, first served: admit the queue front; preempt the most recently admitted."""

    config: EngineConfig | None = None

    def next_waiting(self, waiting: Seq[Sequence]) -> Sequence:
        return waiting[0]

    def choose_victim(self, candidates: Seq[Sequence]) -> Sequence:
        return candidates[-1]


def takes_step(policy: Any) -> bool:
    """Whether ``policy.next_waiting`` declares a parameter named ``step``."""
    try:
        return "step" in inspect.signature(policy.next_waiting).parameters
    except (AttributeError, TypeError, ValueError):
        return False
