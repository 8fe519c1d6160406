"""LogitPipeline: processor order, PositionKind filtering, observers, immutability of the input."""

from __future__ import annotations

import math

import pytest
import torch

from metrale_core.plugin.components import LogitProcessorSpec
from metrale_core.sampling import (
    DEBUG_OBSERVERS_ENV,
    DefaultSampler,
    LogitPipeline,
    LogitProcessorFailed,
    ObserverWroteLogits,
    PositionKind,
)

PK = PositionKind


def _spec(name, order=100, kinds=frozenset(PositionKind), read_only=False):
    return LogitProcessorSpec(name=name, factory=lambda cfg: None, order=order, kinds=kinds, read_only=read_only)


class Recorder:
    """Records each call's context and a copy of the logits it saw; optionally masks a token."""

    def __init__(self, log=None, name="", mask_token=None):
        self.calls, self.log, self.name, self.mask_token = [], log, name, mask_token

    def __call__(self, logits, ctx):
        self.calls.append((ctx, logits.clone()))
        if self.log is not None:
            self.log.append(self.name)
        if self.mask_token is not None:
            logits[:, self.mask_token] = -math.inf


def _pipeline(*processors, **kw):
    return LogitPipeline(list(processors), DefaultSampler(), **kw)


def test_processors_run_in_ascending_order(make_row):
    log = []
    stages = [(_spec(f"p{o}", order=o), Recorder(log, f"p{o}")) for o in (30, 10, 20)]
    stages.insert(1, (_spec("tie20", order=20), Recorder(log, "tie20")))
    pipe = _pipeline(*stages)
    assert pipe.processor_names == ("p10", "tie20", "p20", "p30")
    pipe.adjusted_logits(torch.zeros(1, 4), [make_row()], [PK.FINAL_DECODE])
    assert log == ["p10", "tie20", "p20", "p30"]


def test_kind_filtering_final_decode_only_never_sees_verify(make_row):
    rec = Recorder()
    pipe = _pipeline((_spec("final", kinds={PK.FINAL_DECODE}), rec))
    logits = torch.arange(20, dtype=torch.float32).reshape(4, 5)
    rows = [make_row() for _ in range(4)]
    kinds = [PK.VERIFY, PK.FINAL_DECODE, PK.VERIFY, PK.PREFILL_LAST]
    pipe.sample(logits, rows, kinds)
    ((ctx, seen),) = rec.calls
    assert ctx.indices == (1,) and ctx.kinds == (PK.FINAL_DECODE,) and ctx.rows == (rows[1],)
    assert torch.equal(seen, logits[1:2])
    rec.calls.clear()
    pipe.sample(logits[[0, 2]], rows[:2], [PK.VERIFY, PK.VERIFY])
    assert rec.calls == []


def test_writer_on_row_subset_is_scattered_back(make_row):
    pipe = _pipeline((_spec("mask0", kinds={PK.VERIFY}), Recorder(mask_token=0)))
    logits = torch.ones(3, 4)
    kinds = [PK.VERIFY, PK.FINAL_DECODE, PK.VERIFY]
    out = pipe.adjusted_logits(logits, [make_row() for _ in range(3)], kinds)
    assert torch.isneginf(out[[0, 2], 0]).all()
    assert torch.equal(out[1], torch.ones(4)) and torch.equal(out[:, 1:], torch.ones(3, 3))
    assert torch.equal(logits, torch.ones(3, 4))


def test_writer_may_return_a_new_tensor(make_row):
    def add_ten(logits, ctx):
        return logits + 10.0

    pipe = _pipeline((_spec("add", kinds={PK.PREFILL_LAST}), add_ten))
    kinds = [PK.FINAL_DECODE, PK.PREFILL_LAST]
    out = pipe.adjusted_logits(torch.zeros(2, 3), [make_row(), make_row()], kinds)
    assert out.tolist() == [[0.0] * 3, [10.0] * 3]


def test_observer_sees_masked_logits_before_penalties_and_bias(make_row):
    early_mask = Recorder(mask_token=2)
    observer = Recorder()
    late_mask = Recorder(mask_token=3)
    pipe = _pipeline(
        (_spec("late", order=90), late_mask),
        (_spec("observer", order=50, read_only=True), observer),
        (_spec("early", order=10), early_mask),
    )
    logits = torch.tensor([[2.0, -1.0, 3.0, 0.5, 1.0]])
    row = make_row(prompt=[0, 1], repetition_penalty=2.0, logit_bias={4: 5.0})
    adjusted = pipe.adjusted_logits(logits, [row], [PK.FINAL_DECODE])
    ((_, seen),) = observer.calls
    assert seen.tolist() == [[2.0, -1.0, -math.inf, 0.5, 1.0]]
    assert adjusted.tolist() == [[1.0, -2.0, -math.inf, -math.inf, 6.0]]


def test_well_behaved_observer_leaves_logits_bit_exact(make_row):
    seen = []
    pipe = _pipeline((_spec("obs", read_only=True), lambda lg, ctx: seen.append(lg.clone())))
    logits = torch.randn(3, 7)
    logits[0, 0] = -0.0
    before = logits.clone()
    out = pipe.adjusted_logits(logits, [make_row() for _ in range(3)], [PK.FINAL_DECODE] * 3)
    assert torch.equal(logits.view(torch.int32), before.view(torch.int32))
    assert torch.equal(out.view(torch.int32), seen[0].view(torch.int32))


@pytest.mark.parametrize("kinds", [[PK.FINAL_DECODE] * 2, [PK.FINAL_DECODE, PK.VERIFY]])
def test_observer_writing_in_place_is_caught(make_row, kinds):
    def bad(logits, ctx):
        logits[:, 0] += 1.0

    pipe = _pipeline((_spec("sneaky", read_only=True, kinds={PK.FINAL_DECODE}), bad))
    with pytest.raises(ObserverWroteLogits, match="sneaky"):
        pipe.sample(torch.zeros(2, 4), [make_row(), make_row()], kinds)


def test_debug_mode_catches_writes_past_the_version_counter(make_row, monkeypatch):
    def bad(logits, ctx):
        logits.numpy()[0, 1] = 42.0

    spec = _spec("numpy_writer", read_only=True)
    rows, kinds = [make_row()], [PK.FINAL_DECODE]
    with pytest.raises(ObserverWroteLogits, match="numpy_writer"):
        _pipeline((spec, bad), debug_observers=True).sample(torch.zeros(1, 4), rows, kinds)
    monkeypatch.setenv(DEBUG_OBSERVERS_ENV, "1")
    assert _pipeline((spec, bad)).debug_observers
    with pytest.raises(ObserverWroteLogits):
        _pipeline((spec, bad)).sample(torch.zeros(1, 4), rows, kinds)
    monkeypatch.setenv(DEBUG_OBSERVERS_ENV, "0")
    assert not _pipeline((spec, bad)).debug_observers


def test_sample_never_modifies_input(make_row):
    pipe = _pipeline((_spec("mask", order=5), Recorder(mask_token=1)), (_spec("obs", read_only=True), Recorder()))
    logits = torch.randn(2, 6)
    before = logits.clone()
    rows = [
        make_row(prompt=[0], output=[2], repetition_penalty=1.5, logit_bias={3: 2.0}, logprobs=2),
        make_row(temperature=0.0),
    ]
    out = pipe.sample(logits, rows, [PK.FINAL_DECODE, PK.VERIFY])
    pipe.processed_logits(logits, rows, [PK.FINAL_DECODE, PK.VERIFY])
    assert torch.equal(logits, before)
    assert 1 not in out.token_ids


def test_processed_logits_is_sampler_process_of_adjusted(make_row):
    pipe = _pipeline((_spec("mask", kinds={PK.VERIFY}), Recorder(mask_token=0)))
    torch.manual_seed(1)
    logits = torch.randn(3, 10)
    rows = [
        make_row(top_k=4, temperature=0.7, presence_penalty=1.0, output=[3]),
        make_row(top_p=0.8),
        make_row(temperature=0.0),
    ]
    kinds = [PK.VERIFY, PK.FINAL_DECODE, PK.VERIFY]
    processed = pipe.processed_logits(logits, rows, kinds)
    expected = DefaultSampler().process(pipe.adjusted_logits(logits, rows, kinds), rows)
    assert torch.equal(processed, expected)
    assert torch.isneginf(processed[0, 0]) and (torch.isfinite(processed[0]).sum() == 4)
    assert torch.isfinite(processed[2]).sum() == 1


def test_processor_errors_name_the_processor(make_row):
    def boom(logits, ctx):
        raise RuntimeError("kaput")

    with pytest.raises(LogitProcessorFailed, match=r"'boom'.*kaput"):
        _pipeline((_spec("boom"), boom)).sample(torch.zeros(1, 3), [make_row()], [PK.VERIFY])
    with pytest.raises(LogitProcessorFailed, match="'shape'"):
        pipe = _pipeline((_spec("shape"), lambda lg, ctx: lg[:, :2]))
        pipe.sample(torch.zeros(1, 3), [make_row()], [PK.VERIFY])


def test_shape_mismatch_between_rows_and_kinds(make_row):
    with pytest.raises(ValueError, match="kinds"):
        _pipeline().sample(torch.zeros(2, 3), [make_row(), make_row()], [PK.VERIFY])
