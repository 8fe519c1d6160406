"""Repetition / presence / frequency penalties and logit_bias against hand-computed logits."""

from __future__ import annotations

import math

import pytest
import torch

from metrale_core.errors import InvalidRequest
from metrale_core.sampling import apply_penalties_and_bias

BASE = [2.0, -1.0, 0.5, -3.0, 1.0, 0.0]


def _apply(rows, logits=None):
    logits = torch.tensor([BASE] * len(rows)) if logits is None else logits
    before = logits.clone()
    out = apply_penalties_and_bias(logits, rows)
    assert torch.equal(logits, before), "the input logits must not be modified"
    return out


def test_repetition_penalty_hf_semantics(make_row):
    # tokens 0, 1 (prompt) and 3, 5 (output): positive / 2, non-positive * 2
    row = make_row(prompt=[0, 1, 1], output=[3, 5], repetition_penalty=2.0)
    assert _apply([row])[0].tolist() == [1.0, -2.0, 0.5, -6.0, 1.0, 0.0]


def test_repetition_penalty_below_one_encourages(make_row):
    row = make_row(prompt=[0], output=[1], repetition_penalty=0.5)
    assert _apply([row])[0].tolist() == [4.0, -0.5, 0.5, -3.0, 1.0, 0.0]


def test_presence_and_frequency_over_output_only(make_row):
    # output counts: token 1 x2, token 2 x1; prompt token 4 is not penalised
    row = make_row(prompt=[4, 4], output=[1, 2, 1], presence_penalty=0.5, frequency_penalty=0.25)
    expected = [2.0, -1.0 - 0.5 - 0.5, 0.5 - 0.5 - 0.25, -3.0, 1.0, 0.0]
    assert _apply([row])[0].tolist() == pytest.approx(expected)


def test_negative_presence_and_frequency(make_row):
    row = make_row(output=[0, 0, 0], presence_penalty=-1.0, frequency_penalty=-0.5)
    assert _apply([row])[0].tolist() == pytest.approx([2.0 + 1.0 + 1.5] + BASE[1:])


def test_logit_bias(make_row):
    row = make_row(logit_bias={0: 5.0, 3: -100.0, 5: 0.25})
    assert _apply([row])[0].tolist() == pytest.approx([7.0, -1.0, 0.5, -103.0, 1.0, 0.25])


def test_all_penalties_apply_in_order(make_row):
    # repetition (prompt+output: 0, 1, 2), then presence/frequency (output: 1, 2, 2), then bias
    row = make_row(
        prompt=[0],
        output=[1, 2, 2],
        repetition_penalty=2.0,
        presence_penalty=1.0,
        frequency_penalty=0.5,
        logit_bias={1: 3.0, 4: -1.0},
    )
    expected = [
        2.0 / 2,
        -1.0 * 2 - 1.0 - 0.5 + 3.0,
        0.5 / 2 - 1.0 - 1.0,
        -3.0,
        1.0 - 1.0,
        0.0,
    ]
    assert _apply([row])[0].tolist() == pytest.approx(expected)


def test_batch_rows_independent_and_untouched_rows_bit_exact(make_row):
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    rows = [
        make_row(prompt=list(range(30)), output=[31, 31], repetition_penalty=1.3),
        make_row(prompt=[1, 2]),
        make_row(output=[7], frequency_penalty=2.0),
        make_row(output=[], presence_penalty=1.0, logit_bias={49: 1.5}),
    ]
    out = _apply(rows, logits)
    assert torch.equal(out[1], logits[1])
    seen = torch.zeros(50, dtype=torch.bool)
    seen[list(range(30)) + [31]] = True
    r0 = torch.where(logits[0] > 0, logits[0] / 1.3, logits[0] * 1.3)
    assert torch.equal(out[0], torch.where(seen, r0, logits[0]))
    expected2 = logits[2].clone()
    expected2[7] -= 2.0
    torch.testing.assert_close(out[2], expected2)
    expected3 = logits[3].clone()
    expected3[49] += 1.5
    torch.testing.assert_close(out[3], expected3)


def test_no_penalties_returns_input_object(make_row):
    logits = torch.randn(2, 6)
    rows = [make_row(prompt=[1], output=[2]), make_row(presence_penalty=1.0)]  # no output yet
    assert apply_penalties_and_bias(logits, rows) is logits


def test_masked_tokens_stay_masked(make_row):
    logits = torch.tensor([[-math.inf, 1.0, -math.inf]])
    row = make_row(
        prompt=[0],
        output=[0, 2],
        repetition_penalty=1.5,
        frequency_penalty=1.0,
        presence_penalty=0.5,
        logit_bias={0: 2.0},
    )
    out = _apply([row], logits)
    assert torch.isneginf(out[0, [0, 2]]).all() and out[0, 1].item() == 1.0


def test_logit_bias_outside_vocab_is_invalid_request(make_row):
    with pytest.raises(InvalidRequest, match="token id 6"):
        _apply([make_row(logit_bias={6: 1.0})])
