"""``ModelRunner``: the batch carries the scheduler's split; nothing downstream derives it again."""

from __future__ import annotations

from metrale_core.layers import AttentionPlan
from metrale_core.model_api import StepSplit
from metrale_core.sampling import SamplingParams


def test_the_split_is_derived_once_per_plan_by_the_scheduler(monkeypatch, make_engine, run, toy_model):
    derived = []
    of_lengths = StepSplit.of_lengths

    def counting(cls, lens):
        derived.append(1)
        return of_lengths(lens)

    monkeypatch.setattr(StepSplit, "of_lengths", classmethod(counting))

    attention: list[AttentionPlan] = []

    class AttendingLM(toy_model):  # a model that plans attention the way the decoder does
        def forward(self, batch, kv, state=None):
            attention.append(AttentionPlan.from_batch(batch, 1.0))
            return super().forward(batch, kv, state)

    model = AttendingLM()
    engine = make_engine(model, max_prefill_tokens=5)
    derived.clear()  # the scheduler's initial empty plan
    plans = []
    schedule = engine.scheduler.schedule

    def recording():
        plans.append(schedule())
        return plans[-1]

    monkeypatch.setattr(engine.scheduler, "schedule", recording)
    greedy = SamplingParams(temperature=0.0, max_tokens=4)
    engine.add_request("a", list(range(1, 4)), greedy)
    engine.add_request("b", list(range(10, 22)), greedy)  # prefilled in chunks beside a's decodes
    run(engine)

    assert len(derived) == len(plans)  # one derivation per plan, when the scheduler made it
    stepped = [p for p in plans if p.chunks]
    assert len(model.calls) == len(stepped) == len(attention)
    mixed = 0
    for plan, batch, att in zip(stepped, model.calls, attention, strict=True):
        assert batch.split is plan.split
        lens = [c.num_tokens for c in plan.chunks]
        starts = [sum(lens[:i]) for i in range(len(lens))]
        assert att.pure_decode == all(n == 1 for n in lens)
        if not att.pure_decode:
            ones = [starts[i] for i, n in enumerate(lens) if n == 1]
            assert (att.decode_rows.tolist() if att.decode_rows is not None else []) == ones
            multi = [(starts[i], starts[i] + n, i, plan.chunks[i].start + n) for i, n in enumerate(lens) if n > 1]
            assert list(att.multi_row) == multi
            mixed += bool(ones) and bool(multi)
    assert mixed > 0  # the run had steps with decode rows and prefill chunks side by side


def test_a_one_token_prefill_chunk_is_a_one_row_sequence(monkeypatch, make_engine, run):
    engine = make_engine()
    greedy = SamplingParams(temperature=0.0, max_tokens=2)
    engine.add_request("a", list(range(1, 9)), greedy)  # two full blocks of 4, cached
    run(engine)
    engine.add_request("b", list(range(1, 10)), greedy)  # hits both blocks: one token to prefill
    plan = engine.scheduler.schedule()
    (chunk,) = plan.chunks
    assert (chunk.num_tokens, chunk.is_decode, chunk.sample) == (1, False, True)
    assert plan.split == StepSplit(1, (0,), (0,), ())  # attention's decode row ...
    assert (plan.decode_chunks, plan.num_prefill_tokens) == ((), 1)  # ... and the scheduler's prefill
