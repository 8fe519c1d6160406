"""The ``reasoning-budget`` processor: its state machine over output ids, the forced end, the
cache of committed positions, and the pipeline's refusal when no processor enforces budgets."""

from __future__ import annotations

import math

import pytest
import torch

from metrale_core.plugin.components import LogitProcessorSpec
from metrale_core.sampling import DefaultSampler, LogitPipeline, PositionKind, ReasoningBudget, StructuredOutputError
from metrale_core.sampling.reasoning_budget import ReasoningBudgetProcessor, budget_state

START, END, NL, A, B = 1, 2, 3, 4, 5  # <think>, </think>, "\n", two plain tokens
V = 8


def _budget(tokens, **kw):
    return ReasoningBudget(tokens=tokens, end_ids=(END,), forced_ids=(NL, END, NL, NL), start_ids=(START,), **kw)


def _forced(make_row, budget, output, kind=PositionKind.FINAL_DECODE, row=None):
    """The token the processor forces after ``output`` (None when it leaves the row free)."""
    row = row or make_row(reasoning_budget=budget)
    row.output_ids = list(output)
    logits = torch.zeros(1, V)
    ReasoningBudgetProcessor()(logits, _ctx(row, kind))
    finite = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    return None if len(finite) == V else finite


def _ctx(row, kind):
    from metrale_core.sampling import ProcessorContext

    return ProcessorContext(indices=(0,), rows=(row,), kinds=(kind,))


def test_free_before_the_reasoning_and_inside_the_budget(make_row):
    budget = _budget(3)
    assert _forced(make_row, budget, []) is None
    assert _forced(make_row, budget, [A, B]) is None  # no <think> yet: nothing counts
    assert _forced(make_row, budget, [START, A, B]) is None  # 2 of 3


def test_spent_budget_forces_the_end_token_by_token_then_frees(make_row):
    budget = _budget(3)
    out = [START, A, B, A]
    forced = []
    for _ in range(4):
        token = _forced(make_row, budget, out)
        assert token is not None and len(token) == 1
        forced.append(token[0])
        out.append(token[0])
    assert forced == [NL, END, NL, NL]
    assert _forced(make_row, budget, out) is None
    assert _forced(make_row, budget, [*out, A, A, A, A]) is None  # the answer is never bounded


def test_a_model_that_closes_its_reasoning_in_time_is_never_forced(make_row):
    budget = _budget(3)
    assert _forced(make_row, budget, [START, A, END]) is None
    assert _forced(make_row, budget, [START, A, END, A, B, A]) is None


def test_forcing_continues_after_a_newline_the_model_wrote(make_row):
    assert _forced(make_row, _budget(3), [START, A, B, NL]) == [END]


def test_starts_inside_counts_from_the_first_output_token(make_row):
    inside = _budget(2, starts_inside=True)
    assert _forced(make_row, inside, [A]) is None
    assert _forced(make_row, inside, [A, B]) == [NL]
    zero = _budget(0, starts_inside=True)
    assert _forced(make_row, zero, []) == [NL]


def test_forced_token_keeps_its_logit_and_everything_else_is_minus_inf(make_row):
    row = make_row(reasoning_budget=_budget(1))
    row.output_ids = [START, A]
    logits = torch.arange(V, dtype=torch.float32).unsqueeze(0)
    ReasoningBudgetProcessor()(logits, _ctx(row, PositionKind.FINAL_DECODE))
    assert logits[0, NL] == NL and all(math.isinf(v) and v < 0 for i, v in enumerate(logits[0].tolist()) if i != NL)


def test_committed_state_is_cached_and_verify_positions_are_not(make_row):
    budget = _budget(3)
    row = make_row(reasoning_budget=budget)
    _forced(make_row, budget, [START, A], row=row)
    cached = row.extras["reasoning-budget"]
    assert (cached.seen, cached.phase, cached.counted) == (2, "inside", 1)
    # a verify position with a draft that may be rejected: computed afresh, the cache untouched
    assert _forced(make_row, budget, [START, A, B, A], PositionKind.VERIFY, row=row) == [NL]
    assert row.extras["reasoning-budget"] is cached and cached.seen == 2
    # a history shorter than the cache (a sequence rewound) is recomputed from scratch
    assert budget_state(budget, [START], cached).counted == 0


def test_record_checks():
    with pytest.raises(ValueError):
        ReasoningBudget(tokens=1, end_ids=(), forced_ids=(END,), start_ids=(START,))
    with pytest.raises(ValueError):
        ReasoningBudget(tokens=1, end_ids=(END,), forced_ids=(END,))  # outside, with no start
    with pytest.raises(ValueError):
        ReasoningBudget(tokens=-1, end_ids=(END,), forced_ids=(END,), start_ids=(START,))


def test_pipeline_refuses_a_budget_nobody_enforces(make_row):
    row = make_row(reasoning_budget=_budget(3))
    with pytest.raises(StructuredOutputError) as caught:
        LogitPipeline([], DefaultSampler()).validate(row.params)
    assert caught.value.param == "thinking_token_budget"
    spec = LogitProcessorSpec(name="reasoning-budget", factory=ReasoningBudgetProcessor, order=40)
    LogitPipeline([(spec, ReasoningBudgetProcessor())], DefaultSampler()).validate(row.params)


def test_builtins_register_the_processor():
    from metrale_core.plugin.discovery import load_registry

    spec = load_registry().logit_processors["reasoning-budget"]
    assert spec.order < 50 and isinstance(
        spec.factory(None), ReasoningBudgetProcessor
    )  # before structured output's grammar
