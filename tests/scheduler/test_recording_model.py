"""The recording fake model on its own: answers, KV readback, injected faults and seed 004's
recurrent-state rules, driven by hand-built ForwardBatches (no engine)."""

from __future__ import annotations

import attrs
import pytest
import torch

from metrale_core.errors import KVCacheExhausted
from metrale_core.model_api import CausalLM, ForwardBatch, PagedKVCache
from metrale_core.testing import EOS, GARBAGE, FakeClock, RecordingModel, RecurrentTracker, SeqScript

BS = 4
A = SeqScript(prompt=[10, 11, 12, 13, 14], output=[20, 21, 22])
B = SeqScript(prompt=[30, 31, 32], output=[40, 41])


def seq(table, start, tokens, *, logits=True, slot=-1):
    return dict(table=list(table), start=start, tokens=list(tokens), logits=logits, slot=slot)


def make_batch(*seqs, block_size=BS) -> ForwardBatch:
    ids, pos, slots, wanted, qs = [], [], [], [], [0]
    for s in seqs:
        for j, t in enumerate(s["tokens"]):
            p = s["start"] + j
            ids.append(t)
            pos.append(p)
            slots.append(s["table"][p // block_size] * block_size + p % block_size)
        if s["logits"]:
            wanted.append(len(ids) - 1)
        qs.append(len(ids))
    width = max(len(s["table"]) for s in seqs)
    t = lambda v: torch.tensor(v, dtype=torch.int64)
    return ForwardBatch(
        input_ids=t(ids),
        positions=t(pos),
        query_start=t(qs),
        context_lens=t([s["start"] + len(s["tokens"]) for s in seqs]),
        block_tables=t([s["table"] + [0] * (width - len(s["table"])) for s in seqs]),
        slot_mapping=t(slots),
        logits_rows=t(wanted),
        state_slots=t([s["slot"] for s in seqs]),
        state_fresh=torch.tensor([s["start"] == 0 for s in seqs], dtype=torch.bool),
        query_lens_host=tuple(len(s["tokens"]) for s in seqs),
        context_lens_host=tuple(s["start"] + len(s["tokens"]) for s in seqs),
        block_size=block_size,
    )


def new_cache(model: RecordingModel, blocks=16) -> PagedKVCache:
    return PagedKVCache.allocate(model.info.kv, blocks, BS)


def answers(logits: torch.Tensor) -> list[int]:
    return logits.argmax(dim=-1).tolist()


def test_is_a_causal_lm_and_answers_its_script_then_eos():
    model = RecordingModel([A, B])
    assert isinstance(model, CausalLM)
    assert model.info.recurrent is None and model.make_state_pool(4) is None
    kv = new_cache(model)
    out = model.forward(make_batch(seq([1, 2], 0, A.prompt), seq([5], 0, B.prompt)), kv)
    assert out.shape == (2, 64) and out.dtype == torch.float32
    assert answers(out) == [20, 40]
    out = model.forward(make_batch(seq([1, 2], 5, [20]), seq([5], 3, [40])), kv)
    assert answers(out) == [21, 41]
    out = model.forward(make_batch(seq([1, 2], 6, [21]), seq([5, 6], 4, [41])), kv)
    assert answers(out) == [22, EOS]  # B's script is over: EOS
    assert model.lines[0] == "forward #0: s10@0+5 fresh -> 20 | s30@0+3 fresh -> 40"
    assert model.lines[2] == "forward #2: s10@6+1 -> 22 | s30@4+1 -> 2"
    assert model.errors == []


def test_chunk_without_logits_and_custom_past_end():
    model = RecordingModel({10: A}, past_end=7)
    kv = new_cache(model)
    assert model.forward(make_batch(seq([1, 2], 0, A.prompt[:3], logits=False)), kv).shape == (0, 64)
    assert answers(model.forward(make_batch(seq([1, 2], 3, A.prompt[3:])), kv)) == [20]
    assert model.lines[:2] == ["forward #0: s10@0+3 fresh", "forward #1: s10@3+2 -> 20"]
    for p, tok in ((5, 20), (6, 21), (7, 22)):
        out = model.forward(make_batch(seq([1, 2], p, [tok])), kv)
    assert answers(out) == [7]


def test_key_is_read_back_from_the_cache_when_position_0_is_not_fed():
    model = RecordingModel([A, B])
    kv = new_cache(model)
    model.forward(make_batch(seq([3], 0, B.prompt)), kv)
    model.forward(make_batch(seq([1, 2], 0, A.prompt)), kv)
    # decode rows alone carry no first token: the model must find s30 / s10 through the tables
    out = model.forward(make_batch(seq([1, 2], 5, [20]), seq([3], 3, [40])), kv)
    assert [c.key for c in model.calls[-1].seqs] == [10, 30]
    assert answers(out) == [21, 41]


def test_kv_readback_catches_a_wrong_block_table():
    model = RecordingModel([A, B])
    kv = new_cache(model)
    model.forward(make_batch(seq([1, 2], 0, A.prompt), seq([3], 0, B.prompt)), kv)
    # A's second block (positions 4..7) is block 2; a table naming block 3 reads B's tokens
    out = model.forward(make_batch(seq([1, 3], 5, [20])), kv)
    assert answers(out) == [GARBAGE]
    assert model.errors and "s10 KV readback at position 4" in model.errors[0]
    assert "expected 14@4" in model.errors[0]


def test_kv_readback_catches_a_wrong_fed_token_and_wrong_positions():
    model = RecordingModel([A])
    kv = new_cache(model)
    model.forward(make_batch(seq([1, 2], 0, A.prompt)), kv)
    assert answers(model.forward(make_batch(seq([1, 2], 5, [33])), kv)) == [GARBAGE]
    assert "expected 20@5" in model.errors[-1]
    batch = make_batch(seq([1, 2], 5, [20]))
    bad = attrs.evolve(batch, positions=torch.tensor([6]))
    assert answers(model.forward(bad, kv)) == [GARBAGE]
    assert "rows at positions [6], expected 5..5" in model.errors[-1]


def test_unknown_first_token_is_an_error_not_a_crash():
    model = RecordingModel([A])
    kv = new_cache(model)
    assert answers(model.forward(make_batch(seq([1], 0, [50, 51])), kv)) == [GARBAGE]
    assert "first token 50, which no script starts with" in model.errors[0]


def test_injected_kv_exhaustion_consumes_nothing():
    model = RecordingModel([A], fail_kv_at_steps={1}, recurrent_fed_rows=True)
    pool = model.make_state_pool(2)
    kv = new_cache(model)
    model.forward(make_batch(seq([1, 2], 0, A.prompt[:2], logits=False, slot=0)), kv, pool)
    before = kv.k[0].clone()
    with pytest.raises(KVCacheExhausted, match="injected by RecordingModel at forward #1"):
        model.forward(make_batch(seq([1, 2], 2, A.prompt[2:], slot=0)), kv, pool)
    assert torch.equal(kv.k[0], before)
    assert model.lines[-1] == "forward #1: raise KVCacheExhausted (injected)"
    # the same chunk re-run afterwards is clean: the failed forward did not advance the state
    assert answers(model.forward(make_batch(seq([1, 2], 2, A.prompt[2:], slot=0)), kv, pool)) == [20]
    assert model.errors == []


def test_recurrent_mode_declares_state_and_rerun_corrupts_for_good():
    model = RecordingModel([A], recurrent_fed_rows=True)
    assert model.info.has_recurrent_state
    pool = model.make_state_pool(2)
    kv = new_cache(model)
    model.forward(make_batch(seq([1, 2], 0, A.prompt, slot=1)), kv, pool)
    model.forward(make_batch(seq([1, 2], 5, [20], slot=1)), kv, pool)
    # the same decode row fed again: state expected 6, consumed at 5
    out = model.forward(make_batch(seq([1, 2], 5, [20], slot=1)), kv, pool)
    assert answers(out) == [GARBAGE]
    assert model.lines[-1] == "recurrent state of s10 consumed again at 5 (expected 6)"
    # for good: the correct next position is garbage too, and no second corruption line
    n = len(model.lines)
    assert answers(model.forward(make_batch(seq([1, 2], 6, [21], slot=1)), kv, pool)) == [GARBAGE]
    assert model.lines[n:] == ["forward #3: s10@6+1 -> GARBAGE"]


def test_recurrent_start_0_resets_fresh_state():
    model = RecordingModel([A], recurrent_fed_rows=True)
    pool = model.make_state_pool(2)
    kv = new_cache(model)
    model.forward(make_batch(seq([1, 2], 0, A.prompt, slot=0)), kv, pool)
    model.forward(make_batch(seq([1, 2], 0, A.prompt, slot=0)), kv, pool)  # re-prefill from 0: fine
    assert model.errors == [] and len(model.lines) == 2
    model.forward(make_batch(seq([1, 2], 3, A.prompt[3:], slot=0)), kv, pool)  # expected 5
    assert model.lines[-1] == "recurrent state of s10 consumed again at 3 (expected 5)"
    # a preempted sequence replaying its history from 0 (in another slot) is clean again
    out = model.forward(make_batch(seq([4, 5], 0, A.prompt + (20,), slot=1)), kv, pool)
    assert answers(out) == [21] and model.errors == []


def test_recurrent_state_is_keyed_by_first_token_not_slot():
    model = RecordingModel([A, B], recurrent_fed_rows=True)
    pool = model.make_state_pool(2)
    kv = new_cache(model)
    model.forward(make_batch(seq([1, 2], 0, A.prompt, slot=0), seq([3], 0, B.prompt, slot=1)), kv, pool)
    out = model.forward(make_batch(seq([3], 3, [40], slot=1), seq([1, 2], 5, [20], slot=0)), kv, pool)
    assert answers(out) == [41, 21]
    # a first row that does not start at the expected position of a fresh key corrupts it
    tracker = RecurrentTracker(enabled=True, record=(lines := []).append)
    assert tracker.consume(99, 4, 1) is False
    assert lines == ["recurrent state of s99 consumed again at 4 (expected 0)"]
    assert RecurrentTracker(enabled=False, record=lines.append).consume(99, 4, 1) is True


def test_recurrent_contract_checks_fresh_flag_and_slot_owner():
    model = RecordingModel([A, B], recurrent_fed_rows=True)
    pool = model.make_state_pool(2)
    kv = new_cache(model)
    model.forward(make_batch(seq([1, 2], 0, A.prompt, slot=0), seq([3], 0, B.prompt, slot=1)), kv, pool)
    out = model.forward(make_batch(seq([1, 2], 5, [20], slot=1)), kv, pool)  # A continues in B's slot
    assert answers(out) == [GARBAGE]
    assert "s10 continues in state slot 1, which holds the state of s30" in model.errors[-1]
    assert answers(model.forward(make_batch(seq([3], 3, [40], slot=-1)), kv, pool)) == [GARBAGE]
    assert "s30 has state slot -1" in model.errors[-1]


def test_scripts_must_have_distinct_first_tokens_and_fit_the_vocab():
    with pytest.raises(ValueError, match="share the first prompt token 10"):
        RecordingModel([A, SeqScript([10, 5], [6])])
    with pytest.raises(ValueError, match=r"\[0, 16\)"):
        RecordingModel([A], vocab_size=16)


def test_fake_clock():
    clock = FakeClock()
    assert clock() == 0.0 and clock.advance(2.5) == 2.5 and clock() == 2.5
    with pytest.raises(ValueError):
        clock.advance(-1)
