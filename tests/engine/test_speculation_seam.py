"""Speculation behind one seam: the null driver, the draft source, read-only scheduler state.

With no speculator the engine's driver is ``NULL_SPECULATION`` and ``step()`` runs the same
path; with one, the scheduler asks the driver for drafts and each verify chunk carries its
``Draft``.  ``Scheduler.in_flight`` is written only by the scheduler.
"""

from __future__ import annotations

import pytest

from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.engine.spec_driver import NULL_SPECULATION, SpecDriver
from metrale_core.engine.speculation import Draft
from metrale_core.sampling import SamplingParams
from metrale_core.testing.recording_model import RecordingModel, SeqScript

SCRIPT = SeqScript([5, 6], [7, 8, 9, 10, 11])
GREEDY = SamplingParams(temperature=0.0, max_tokens=5)


class Oracle:
    """Proposes the script's next two tokens; records the chunks the scheduler built."""

    wants_hidden = False

    def __init__(self) -> None:
        self.reports = []

    def propose(self, seqs, caps):
        out = []
        for seq, cap in zip(seqs, caps):
            done = len(seq.output_ids)
            out.append(Draft(SCRIPT.output[done : done + min(2, cap)]))
        return out

    def observe(self, report) -> None:
        self.reports.append(report)


def _run(engine):
    tokens = []
    while engine.has_unfinished():
        for out in engine.step():
            tokens.extend(out.new_token_ids)
    return tokens


def test_without_a_speculator_the_driver_is_the_null_one():
    engine = LLMEngine(RecordingModel([SCRIPT]), EngineConfig(num_kv_blocks=8))
    assert engine.speculation is NULL_SPECULATION and engine.spec_driver is None
    assert engine.runner.keeps_hidden is False
    engine.add_request("r", [5, 6], GREEDY)
    assert _run(engine) == [7, 8, 9, 10, 11]


def test_drafts_reach_the_plan_through_the_draft_source():
    oracle = Oracle()
    engine = LLMEngine(RecordingModel([SCRIPT]), EngineConfig(num_kv_blocks=8), speculator=oracle)
    assert isinstance(engine.spec_driver, SpecDriver) and engine.spec_driver is engine.speculation
    engine.add_request("r", [5, 6], GREEDY)
    assert _run(engine) == [7, 8, 9, 10, 11]
    verify = [c for r in oracle.reports for c in r.plan.chunks if c.is_verify]
    assert verify, "no verify chunk was planned"
    for chunk in verify:  # each verify chunk carries the Draft it verifies
        assert isinstance(chunk.draft, Draft)
        assert chunk.token_ids[1:] == chunk.draft.token_ids[: chunk.num_tokens - 1]
    assert sum(o.num_accepted for r in oracle.reports for o in r.outcomes) > 0


def test_in_flight_is_written_only_by_the_scheduler():
    engine = LLMEngine(RecordingModel([SCRIPT]), EngineConfig(num_kv_blocks=8))
    with pytest.raises(AttributeError):
        engine.scheduler.in_flight = None
    engine.add_request("r", [5, 6], GREEDY)
    plan = engine.scheduler.schedule()
    assert engine.scheduler.in_flight is plan
    assert engine.scheduler.take_in_flight() is plan and engine.scheduler.in_flight is None
