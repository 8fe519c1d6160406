"""``StepSplit``: the one-row / multi-row split of a step, and ``ForwardBatch.split``'s fallback."""

from __future__ import annotations

import pytest
import torch

from metrale_core.model_api import ForwardBatch, StepSplit


@pytest.mark.parametrize(
    ("lens", "one_row_seqs", "one_row_rows", "multi_row"),
    [
        ((1, 1, 1), (0, 1, 2), (0, 1, 2), ()),
        # a decode, a 4-row verify chunk, a one-token prefill chunk, a 3-row prefill chunk
        ((1, 4, 1, 3), (0, 2), (0, 5), ((1, 5, 1), (6, 9, 3))),
        # a sequence with no rows is in neither part (rows after it keep their offsets)
        ((2, 0, 1), (2,), (2,), ((0, 2, 0),)),
        ((), (), (), ()),
    ],
)
def test_of_lengths(lens, one_row_seqs, one_row_rows, multi_row):
    split = StepSplit.of_lengths(lens)
    assert split == StepSplit(len(lens), one_row_seqs, one_row_rows, multi_row)
    assert split.is_pure_decode == all(n == 1 for n in lens)


def _batch(qlens, **extra) -> ForwardBatch:
    rows = sum(qlens)
    t = lambda xs: torch.tensor(xs, dtype=torch.int64)
    return ForwardBatch(
        input_ids=t([0] * rows),
        positions=t(list(range(rows))),
        query_start=t([0, *torch.tensor(qlens).cumsum(0).tolist()]),
        context_lens=t(list(qlens)),
        block_tables=t([[0]] * len(qlens)),
        slot_mapping=t(list(range(rows))),
        logits_rows=t([rows - 1]),
        state_slots=t([-1] * len(qlens)),
        state_fresh=torch.ones(len(qlens), dtype=torch.bool),
        query_lens_host=tuple(qlens),
        context_lens_host=tuple(qlens),
        block_size=16,
        **extra,
    )


def test_a_batch_built_without_a_split_derives_it_from_its_lengths():
    batch = _batch((3, 1))
    assert batch.split == StepSplit.of_lengths((3, 1))
    assert not batch.is_pure_decode
    assert _batch((1, 1)).is_pure_decode


def test_a_carried_split_is_kept_as_is_and_never_derived(monkeypatch):
    carried = StepSplit.of_lengths((3, 1))
    monkeypatch.setattr(StepSplit, "of_lengths", None)  # any derivation would raise
    batch = _batch((3, 1), split=carried)
    assert batch.split is carried
    assert batch.for_group(0).split is carried


def test_a_split_of_another_batch_size_is_refused():
    with pytest.raises(ValueError, match="covers 3 sequences, the batch 2"):
        _batch((3, 1), split=StepSplit.of_lengths((1, 1, 1)))
