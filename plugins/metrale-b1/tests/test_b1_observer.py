"""The observer in the logit pipeline: read-only, final-decode only, counted only inside bodies
that emitted characters, its place between masks and penalties, its trace and warn lines."""

from __future__ import annotations

import math

import pytest
import torch
from b1_testlib import OBSERVER_LOGGER, Row, captured_lines, gap_logits, observer_spec

from metrale_b1.b1_margin import B1MarginObserver, B1Stats
from metrale_core.plugin.components import LogitProcessorSpec
from metrale_core.sampling import DefaultSampler, LogitPipeline, PositionKind, SamplingParams
from metrale_core.streamparse import make_stream_parser

FD, VERIFY, PREFILL = PositionKind.FINAL_DECODE, PositionKind.VERIFY, PositionKind.PREFILL_LAST
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": '
WARNING = (
    "B1 drift gauge: {} low-margin (<1.5 logprobs) decode positions observed inside "
    "parameter bodies. FP8 numerical noise is in the argmax-flip regime \u2014 consider "
    "reviewing tool-arg outputs for whitespace / digit-collapse drift."
)


def parser_after(text: str, **options):
    parser = make_stream_parser(tool_parser=options.pop("tool_parser", "hermes"), **options)
    parser.feed(text)
    return parser


def in_body_row() -> Row:
    return Row(parser_after(CALL + '"Par'))


def pipeline_of(stats: B1Stats, *extra) -> LogitPipeline:
    return LogitPipeline([(observer_spec(stats), B1MarginObserver(stats)), *extra], DefaultSampler())


def test_logits_are_never_written_bit_for_bit():
    stats = B1Stats()
    logits = gap_logits(6, gap=1.0)
    logits[2, 7] = -0.0
    logits[3, :] = float("-inf")
    logits[3, 4] = 1.0
    copy = logits.clone()
    rows = [in_body_row() for _ in range(6)]
    pipeline = LogitPipeline(
        [(observer_spec(stats), B1MarginObserver(stats))], DefaultSampler(), debug_observers=True
    )  # also raises ObserverWroteLogits on a write
    out = pipeline.sample(logits, rows, [FD] * 6)
    assert torch.equal(logits.view(torch.int32), copy.view(torch.int32))
    assert stats.b1_low_margin == 5  # every row but the one whose runner-up is -inf
    assert out.token_ids == [5, 5, 5, 4, 5, 5]
    # called directly on a sub-batch too
    B1MarginObserver(stats)(logits[1:4], type("Ctx", (), {"rows": rows[1:4]})())
    assert torch.equal(logits.view(torch.int32), copy.view(torch.int32))


@pytest.mark.parametrize("kind, counted", [(FD, True), (VERIFY, False), (PREFILL, False)])
def test_only_final_decode_positions_are_counted(kind, counted):
    stats = B1Stats()
    rows = [in_body_row() for _ in range(4)]
    pipeline_of(stats).sample(gap_logits(4), rows, [kind] * 4)
    assert stats.b1_low_margin == (4 if counted else 0)


def test_mixed_batch_counts_only_final_decode_rows():
    stats = B1Stats()
    rows = [in_body_row() for _ in range(5)]
    pipeline_of(stats).sample(gap_logits(5), rows, [VERIFY, FD, VERIFY, PREFILL, FD])
    assert stats.b1_low_margin == 2


STATES = {
    "no parser": (lambda: Row(None), False),
    "content only": (lambda: Row(parser_after("Sure, let me check.")), False),
    "in the call header": (lambda: Row(parser_after('<tool_call>\n{"name": "get_w')), False),
    "in an argument key": (lambda: Row(parser_after('<tool_call>\n{"name": "f", "arguments": {"ci')), False),
    "body opened, nothing emitted": (lambda: Row(parser_after(CALL + '"')), False),
    "body with one character": (lambda: Row(parser_after(CALL + '"P')), True),
    "after the body closed": (lambda: Row(parser_after(CALL + '"Paris"')), False),
    "after the call": (lambda: Row(parser_after(CALL + '"Paris"}}\n</tool_call>')), False),
    "reasoning text shaped like a call": (
        lambda: Row(parser_after(CALL + '"Par', reasoning="qwen3", starts_in_reasoning=True)),
        False,
    ),
    "tool parsing off": (lambda: Row(parser_after(CALL + '"Par', tool_parser="none")), False),
}


@pytest.mark.parametrize("name", sorted(STATES))
def test_counted_only_inside_a_body_that_emitted_characters(name):
    make, counted = STATES[name]
    stats = B1Stats()
    pipeline_of(stats).sample(gap_logits(1), [make()], [FD])
    assert stats.b1_low_margin == int(counted)


@pytest.mark.parametrize(
    "gap, counted",
    [(0.0, True), (1.0, True), (1.499, True), (1.5, False), (2.0, False), (math.inf, False), (math.nan, False)],
)
def test_threshold_is_a_strict_gap_below_one_and_a_half(gap, counted):
    stats = B1Stats()
    logits = gap_logits(1, gap=1.0)
    logits[0, 9] = 10.0 - gap  # a NaN row cannot be sampled: run the stages before the sampler
    pipeline_of(stats).adjusted_logits(logits, [in_body_row()], [FD])
    assert stats.b1_low_margin == int(counted)


def test_sits_after_masks_and_before_penalties_and_bias():
    """A mask (order 100) removes token 5; a penalty processor (order 200), the repetition penalty
    and logit_bias change 9 and 11.  The observer sees 9 (9.5) over 11 (9.0): masked, unpenalised."""
    stats = B1Stats()
    logits = torch.zeros(1, 16)
    logits[0, 5], logits[0, 9], logits[0, 11] = 10.0, 9.5, 9.0

    def mask(x, ctx):
        x[:, 5] = float("-inf")

    def penalise(x, ctx):
        x[:, 9] -= 5.0

    row = in_body_row()
    row.params = SamplingParams(temperature=0.0, max_tokens=8, repetition_penalty=2.0, logit_bias={11: 3.0})
    row.output_ids = [9]
    pipeline = pipeline_of(
        stats,
        (LogitProcessorSpec("mask", lambda c: mask, order=100), mask),
        (LogitProcessorSpec("pen", lambda c: penalise, order=200), penalise),
    )
    assert pipeline.processor_names == ("mask", "b1-margin", "pen")
    with captured_lines() as lines:
        out = pipeline.sample(logits, [row], [FD])
    assert out.token_ids == [11]  # what the sampler saw: 9 penalised twice, 11 biased up
    assert lines == [("TRACE", OBSERVER_LOGGER, "B1 low margin: gap=0.500 top1=9 top2=11")]
    assert stats.b1_low_margin == 1


def test_trace_line_per_position_and_warn_every_hundred():
    stats = B1Stats()
    pipeline = pipeline_of(stats)
    rows = [in_body_row() for _ in range(7)]
    with captured_lines() as lines:
        for step in range(36):  # 252 counted positions
            logits = gap_logits(7, gap=0.25, top1=3, top2=12, seed=step)
            pipeline.sample(logits, rows, [FD] * 7)
    traces = [m for level, _, m in lines if level == "TRACE"]
    warnings = [m for level, _, m in lines if level == "WARNING"]
    assert len(traces) == 252 and set(traces) == {"B1 low margin: gap=0.250 top1=3 top2=12"}
    assert warnings == [WARNING.format(100), WARNING.format(200)]
    assert all(name == OBSERVER_LOGGER for _, name, _ in lines)
    assert stats.b1_low_margin == 252
    # the warn line follows the 100th trace line
    assert [level for level, _, _ in lines].index("WARNING") == 100


def test_warn_period_continues_from_the_shared_count():
    stats = B1Stats(b1_low_margin=98)
    with captured_lines() as lines:
        pipeline_of(stats).sample(gap_logits(3), [in_body_row() for _ in range(3)], [FD] * 3)
    assert [m for level, _, m in lines if level == "WARNING"] == [WARNING.format(100)]
    assert stats.b1_low_margin == 101


def test_no_row_in_a_body_does_no_tensor_work():
    class Exploding:
        device = torch.device("cpu")
        shape = (2, 32)

        def __getattr__(self, name):
            raise AssertionError(f"the observer touched the logits ({name})")

    stats = B1Stats()
    ctx = type("Ctx", (), {"rows": [Row(parser_after("plain text")), Row(None)]})()
    assert B1MarginObserver(stats)(Exploding(), ctx) is None
    assert stats.b1_low_margin == 0
