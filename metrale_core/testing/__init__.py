"""Test helpers for metrale-core and its plugins: the recording fake model, a fake clock, golden
traces and the scenario runner.  The pytest fixtures live in ``metrale_core.testing.pytest_plugin``
(loaded automatically through the ``pytest11`` entry point ``metrale``).

Owner: tests only; nothing in the engine imports this package.
"""

from __future__ import annotations

from metrale_core.testing.clock import FakeClock
from metrale_core.testing.golden import GoldenMismatch, GoldenStore
from metrale_core.testing.recording_model import (
    EOS,
    GARBAGE,
    LOGIT_HIGH,
    ForwardCall,
    RecordingModel,
    SeqCall,
    SeqScript,
    StatePool,
)
from metrale_core.testing.recurrent_state import RecurrentTracker
from metrale_core.testing.scenario import (
    Abort,
    Advance,
    Arrive,
    ClientStream,
    Scenario,
    ScenarioResult,
    run_scenario,
    scripts_of,
)

__all__ = [
    "EOS",
    "GARBAGE",
    "LOGIT_HIGH",
    "Abort",
    "Advance",
    "Arrive",
    "ClientStream",
    "FakeClock",
    "ForwardCall",
    "GoldenMismatch",
    "GoldenStore",
    "RecordingModel",
    "RecurrentTracker",
    "Scenario",
    "ScenarioResult",
    "SeqCall",
    "SeqScript",
    "StatePool",
    "run_scenario",
    "scripts_of",
]
