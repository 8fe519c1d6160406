"""A policy's hold-back: ``next_waiting`` returning None ends admission for the step.

Driven through the real engine over the recording model (``run_scenario``) with inline policy
plugins registered through the real loader, as in tests/plugin/test_hooks.py.  Checked here: None stops
admission while running sequences keep going; the no-deadlock guard (None with nothing running
admits the queue front); a policy that takes ``step`` sees what the step holds, and one that
never returns None schedules exactly like FCFS.
"""

from __future__ import annotations

import importlib.metadata
import sys
import types
from typing import ClassVar

from metrale_core import hookimpl
from metrale_core.engine import AdmissionStep
from metrale_core.plugin.components import SchedulerSpec
from metrale_core.plugin.discovery import load_registry
from metrale_core.testing import EOS, Arrive, Scenario, run_scenario

MODULE = "_metrale_inline_hold_back_policies"


def registry_with_policy(name: str, factory) -> object:
    """A registry holding the built-ins and one scheduler ``name`` built by ``factory``."""

    class Plugin:
        @hookimpl
        def metrale_schedulers(self, register):
            register(SchedulerSpec(name, factory=factory))

    module = sys.modules.setdefault(MODULE, types.ModuleType(MODULE))
    setattr(module, name.replace("-", "_"), Plugin())
    ep = importlib.metadata.EntryPoint(name=name, value=f"{MODULE}:{name.replace('-', '_')}", group="metrale")
    return load_registry(entry_points=[ep])


def prompt(first: int, n: int) -> list[int]:
    return [first + i for i in range(n)]


def assert_streams_complete(result, events) -> None:
    assert "!! stopped after max_steps" not in result.trace
    assert result.model.errors == []
    for event in events:
        stream = result.streams[event.request_id]
        assert stream.token_ids == list(event.output) + [EOS]
        assert stream.finish_reason == "stop"


class HoldWhileDecoding:
    """Admit the queue front unless the step already has decode rows."""

    def __init__(self, config=None):
        self.steps: list[AdmissionStep] = []

    def next_waiting(self, waiting, step=None):
        self.steps.append(step)
        return None if step.num_decodes else waiting[0]

    def choose_victim(self, candidates):
        return candidates[-1]


class AlwaysHold:
    """Returns None every time (the old one-argument signature): only the guard admits."""

    def __init__(self, config=None):
        pass

    def next_waiting(self, waiting):
        return None

    def choose_victim(self, candidates):
        return candidates[-1]


class FcfsWithStep:
    """FCFS that takes ``step`` and records it, never holding back."""

    seen: ClassVar[list[AdmissionStep]] = []

    def __init__(self, config=None):
        FcfsWithStep.seen = []

    def next_waiting(self, waiting, step=None):
        FcfsWithStep.seen.append(step)
        return waiting[0]

    def choose_victim(self, candidates):
        return candidates[-1]


# r10 decodes from step 1 to step 4 (EOS); r20 and r30 arrive while it decodes
HOLD_EVENTS = [
    Arrive(0, "r10", prompt(10, 3), [40, 41, 42]),
    Arrive(1, "r20", prompt(20, 2), [43]),
    Arrive(1, "r30", prompt(30, 5), [44]),
]


def test_none_stops_admission_while_running_sequences_continue():
    fcfs = run_scenario(Scenario("hold_fcfs", HOLD_EVENTS))
    assert fcfs.model.first_prefill() == {10: 0, 20: 1, 30: 1}  # admitted as they arrive

    result = run_scenario(
        Scenario("hold", HOLD_EVENTS, engine=dict(scheduler="hold")),
        registry=registry_with_policy("hold", HoldWhileDecoding),
    )
    assert_streams_complete(result, HOLD_EVENTS)
    # r10 decodes at forwards 1..3 (its EOS at #3): r20/r30 wait, then go in together at #4
    assert result.model.first_prefill() == {10: 0, 20: 4, 30: 4}
    r10_rows = [s.num_rows for call in result.model.calls[:4] for s in call.seqs if s.key == 10]
    assert r10_rows == [3, 1, 1, 1]  # the hold-back never touched r10
    assert "~ running=1 waiting=2" in result.trace


def test_none_with_nothing_running_admits_the_queue_front():
    events = [Arrive(0, f"r{k}", prompt(k, 3), [40 + k // 10]) for k in (10, 20, 30)]
    result = run_scenario(
        Scenario("always_hold", events, engine=dict(scheduler="always-hold")),
        registry=registry_with_policy("always-hold", AlwaysHold),
    )
    assert_streams_complete(result, events)
    # each step with nothing running admits the queue front, then the policy's None stops it:
    # one sequence at a time, in arrival order (prefill, then the EOS decode)
    assert result.model.first_prefill() == {10: 0, 20: 2, 30: 4}
    assert [len(call.seqs) for call in result.model.calls] == [1] * 6


def test_policy_taking_step_sees_the_step_and_schedules_like_fcfs():
    events = [
        Arrive(0, "r10", prompt(10, 3), [40, 41, 42, 43, 44, 45]),
        Arrive(2, "r20", prompt(20, 9), [50, 51]),
        Arrive(2, "r30", prompt(30, 2), [52]),
    ]
    engine = dict(max_prefill_tokens=6)
    fcfs = run_scenario(Scenario("same", events, engine=engine))
    result = run_scenario(
        Scenario("same", events, engine={**engine, "scheduler": "fcfs-step"}),
        registry=registry_with_policy("fcfs-step", FcfsWithStep),
    )
    assert result.trace == fcfs.trace
    assert FcfsWithStep.seen[:3] == [
        # step 0: nothing scheduled yet
        AdmissionStep(num_decodes=0, num_decode_tokens=0, num_prefill_tokens=0, budget=6),
        # step 2: r10 decodes; r20 then gets a first chunk of 6 and the budget is spent
        AdmissionStep(num_decodes=1, num_decode_tokens=1, num_prefill_tokens=0, budget=6),
        # step 3: r10 decodes, r20 continues with 3 tokens; r30 fits the 3 left
        AdmissionStep(num_decodes=1, num_decode_tokens=1, num_prefill_tokens=3, budget=3),
    ]
