"""DefaultSampler: truncation against hand-computed distributions, greedy ties, draws, logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from metrale_core.sampling import DefaultSampler, SamplingError

SAMPLER = DefaultSampler()


def _logits(*probs: float) -> torch.Tensor:
    return torch.tensor([probs], dtype=torch.float32).log()


def _dist(logits, row) -> torch.Tensor:
    return torch.softmax(SAMPLER.process(logits, [row]), dim=-1)[0]


def _close(actual: torch.Tensor, expected) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=1e-6, rtol=1e-5)


def test_top_p_keeps_smallest_set_reaching_p(make_row):
    _close(_dist(_logits(0.1, 0.2, 0.3, 0.4), make_row(top_p=0.6)), [0, 0, 3 / 7, 4 / 7])


def test_top_p_keeps_token_that_crosses_p(make_row):
    # mass before 0.3 is 0.4 < 0.5, so 0.3 stays; mass before 0.2 is 0.7 >= 0.5
    _close(_dist(_logits(0.1, 0.2, 0.3, 0.4), make_row(top_p=0.5)), [0, 0, 3 / 7, 4 / 7])
    _close(_dist(_logits(0.1, 0.2, 0.3, 0.4), make_row(top_p=0.35)), [0, 0, 0, 1])


def test_top_k(make_row):
    _close(_dist(_logits(0.1, 0.2, 0.3, 0.4), make_row(top_k=2)), [0, 0, 3 / 7, 4 / 7])
    _close(_dist(_logits(0.1, 0.2, 0.3, 0.4), make_row(top_k=3)), [0, 2 / 9, 3 / 9, 4 / 9])
    _close(_dist(_logits(0.1, 0.2, 0.3, 0.4), make_row(top_k=10)), [0.1, 0.2, 0.3, 0.4])


def test_min_p(make_row):
    # top probability 0.4: min_p 0.6 drops probabilities below 0.24, min_p 0.3 below 0.12
    _close(_dist(_logits(0.1, 0.2, 0.3, 0.4), make_row(min_p=0.6)), [0, 0, 3 / 7, 4 / 7])
    _close(_dist(_logits(0.1, 0.2, 0.3, 0.4), make_row(min_p=0.3)), [0, 2 / 9, 3 / 9, 4 / 9])


def test_temperature(make_row):
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    for t in (0.5, 2.0):
        expected = probs ** (1 / t) / (probs ** (1 / t)).sum()
        _close(_dist(probs.log()[None], make_row(temperature=t)), expected.tolist())


def test_top_k_then_top_p_on_renormalised_mass(make_row):
    # top-k 3 keeps .35 .25 .2 -> renormalised .4375 .3125 .25; top-p .7: mass before .25 is .75
    # (on the raw distribution it would be .6 < .7 and .2 would wrongly survive)
    row = make_row(top_k=3, top_p=0.7)
    _close(_dist(_logits(0.05, 0.15, 0.2, 0.25, 0.35), row), [0, 0, 0, 0.25 / 0.6, 0.35 / 0.6])


def test_temperature_applies_before_top_p(make_row):
    # T=0.5 squares the probabilities: .01 .04 .09 .16 over .30; top-p .5 keeps only .16/.30
    row = make_row(temperature=0.5, top_p=0.5)
    _close(_dist(_logits(0.1, 0.2, 0.3, 0.4), row), [0, 0, 0, 1])


def test_process_masks_with_minus_inf_and_keeps_survivors(make_row):
    logits = _logits(0.1, 0.2, 0.3, 0.4)
    out = SAMPLER.process(logits, [make_row(top_k=2, temperature=2.0)])
    assert torch.isneginf(out[0, :2]).all()
    torch.testing.assert_close(out[0, 2:], logits[0, 2:] / 2.0)


def test_greedy_tie_takes_first_max(make_row):
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0], [5.0, 0.0, 5.0, 5.0]])
    rows = [make_row(temperature=0.0), make_row(temperature=0.0)]
    assert SAMPLER.sample(logits, rows).token_ids == [1, 0]


def test_greedy_process_is_point_mass(make_row):
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0]])
    out = SAMPLER.process(logits, [make_row(temperature=0.0)])
    assert out[0, 1].item() == 3.0
    assert torch.isneginf(out[0, [0, 2, 3]]).all()


def test_greedy_rows_consume_no_random_numbers(make_row):
    row = make_row(temperature=0.0, seed=7)
    SAMPLER.sample(torch.randn(1, 16), [row])
    fresh = torch.Generator().manual_seed(7)
    assert torch.equal(torch.rand(3, generator=row.generator), torch.rand(3, generator=fresh))


def test_draw_is_inverse_cdf_of_one_uniform(make_row):
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    cdf = probs.cumsum(0)
    for seed in range(40):
        u = torch.rand(1, generator=torch.Generator().manual_seed(seed)).item()
        expected = int((cdf <= u).sum())
        row = make_row(seed=seed)
        assert SAMPLER.sample(probs.log()[None], [row]).token_ids == [expected]


def test_mixed_batch_greedy_and_sampled(make_row):
    logits = torch.tensor([[0.0, 9.0, 1.0], [0.0, 0.0, 50.0], [4.0, 4.0, 1.0]])
    rows = [make_row(temperature=0.0), make_row(temperature=1.0), make_row(temperature=0.0)]
    assert SAMPLER.sample(logits, rows).token_ids == [1, 2, 0]


def test_logprobs_and_top_logprobs(make_row):
    torch.manual_seed(0)
    logits = torch.randn(3, 12)
    rows = [
        make_row(temperature=0.0, logprobs=3),
        make_row(temperature=0.7, top_k=5, logprobs=7, seed=3),
        make_row(temperature=1.3),
    ]
    before = logits.clone()
    out = SAMPLER.sample(logits, rows)
    assert torch.equal(logits, before)
    expected_lp = torch.empty_like(logits)
    expected_lp[0] = torch.log_softmax(logits[0], dim=-1)
    masked = (logits[1] / 0.7).masked_fill(logits[1] < logits[1].topk(5).values[-1], -math.inf)
    expected_lp[1] = torch.log_softmax(masked, dim=-1)
    expected_lp[2] = torch.log_softmax(logits[2] / 1.3, dim=-1)
    for i, token in enumerate(out.token_ids):
        assert out.logprobs[i] == pytest.approx(expected_lp[i, token].item(), abs=1e-5)
    top0 = expected_lp[0].topk(3)
    assert [t for t, _ in out.top_logprobs[0]] == top0.indices.tolist()
    assert [v for _, v in out.top_logprobs[0]] == pytest.approx(top0.values.tolist(), abs=1e-5)
    # row 1 asked for 7 but top-k left 5 tokens: only the 5 finite ones are listed
    top1 = expected_lp[1].topk(5)
    assert [t for t, _ in out.top_logprobs[1]] == top1.indices.tolist()
    assert [v for _, v in out.top_logprobs[1]] == pytest.approx(top1.values.tolist(), abs=1e-5)
    assert out.top_logprobs[1][0][1] <= 0.0
    assert out.top_logprobs[2] == []
    assert out.token_ids[0] == int(logits[0].argmax())


def test_no_logprobs_when_none_asked(make_row):
    out = SAMPLER.sample(torch.randn(2, 5), [make_row(), make_row(temperature=0.0)])
    assert out.logprobs is None and out.top_logprobs is None


def test_logprobs_zero_gives_sampled_logprob_only(make_row):
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    out = SAMPLER.sample(logits, [make_row(temperature=0.0, logprobs=0)])
    assert out.token_ids == [2]
    assert out.logprobs[0] == pytest.approx(torch.log_softmax(logits[0], -1)[2].item())
    assert out.top_logprobs == [[]]


def test_sample_does_not_modify_input(make_row):
    logits = torch.randn(3, 9)
    before = logits.clone()
    rows = [make_row(top_p=0.5, min_p=0.1, logprobs=2), make_row(top_k=2), make_row(temperature=0.0)]
    SAMPLER.sample(logits, rows)
    SAMPLER.process(logits, rows)
    assert torch.equal(logits, before)


def test_fully_masked_row_is_an_error(make_row):
    logits = torch.tensor([[0.0, 1.0], [-math.inf, -math.inf]])
    with pytest.raises(SamplingError, match=r"\[1\]"):
        SAMPLER.sample(logits, [make_row(), make_row()])
    with pytest.raises(SamplingError):
        SAMPLER.sample(torch.tensor([[0.0, math.nan]]), [make_row(temperature=0.0)])
    with pytest.raises(SamplingError, match=r"\[0\]"):
        SAMPLER.sample(torch.tensor([[math.nan, -math.inf], [0.0, 1.0]]), [make_row(), make_row()])
    with pytest.raises(SamplingError, match=r"\[1\]"):
        SAMPLER.sample(torch.tensor([[0.0, 1.0], [math.inf, 0.0]]), [make_row(), make_row()])


def test_partly_masked_rows_sample_their_allowed_tokens(make_row):
    logits = torch.tensor([[-math.inf, 1.0, -math.inf], [0.5, -math.inf, -math.inf]])
    out = SAMPLER.sample(logits, [make_row(temperature=0.0), make_row(temperature=0.7)])
    assert list(out.token_ids) == [1, 0]


def test_shape_mismatch_is_an_error(make_row):
    with pytest.raises(ValueError, match="N = 2"):
        SAMPLER.sample(torch.zeros(3, 4), [make_row(), make_row()])
