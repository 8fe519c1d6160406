"""``metrale_core.layers.parallel``: how tensors and heads are split, and splits that are refused.

The multi-process side (collectives, the engine path) is tested end to end by the qwen3 plugin's
``test_tensor_parallel.py`` and ``tests/server/test_serve_tensor_parallel.py``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from metrale_core.errors import ConfigError, ShapeMismatch
from metrale_core.layers.parallel import (
    HeadSplit,
    RowParallelLinear,
    Shard,
    ShardedStore,
    TensorParallel,
    split_heads,
    split_range,
    split_unit,
)
from metrale_core.weights import RawTensor
from metrale_core.weights.store import RawSource


def test_split_range_is_even_in_whole_units_first_ranks_first():
    assert [split_range(10, 3, r) for r in range(3)] == [(0, 4), (4, 3), (7, 3)]
    assert [split_range(1536, 2, r, 256) for r in range(2)] == [(0, 768), (768, 768)]
    with pytest.raises(ConfigError, match="cannot be split over 4 ranks"):
        split_range(64, 4, 0, 32)
    assert split_unit(1536, 2) == 256 and split_unit(64, 2) == 32 and split_unit(64, 3) == 1


def test_heads_split_by_kv_group_or_replicate_the_kv_head():
    # SmolLM2: 9 heads over 3 KV heads, two ranks: groups 2 + 1.
    assert split_heads(9, 3, 2, 0) == HeadSplit(0, 6, 0, 2)
    assert split_heads(9, 3, 2, 1) == HeadSplit(6, 3, 2, 1)
    # more ranks than KV heads: each rank keeps a copy of the KV head its queries read
    assert [split_heads(8, 2, 4, r) for r in range(4)] == [
        HeadSplit(0, 2, 0, 1),
        HeadSplit(2, 2, 0, 1),
        HeadSplit(4, 2, 1, 1),
        HeadSplit(6, 2, 1, 1),
    ]
    with pytest.raises(ConfigError, match="tensor parallel size 3 cannot split 8 query heads"):
        split_heads(8, 2, 3, 0)


class _Store:
    format = "gguf"

    def __init__(self, raws):
        self.raws = raws

    def __contains__(self, name):
        return name in self.raws

    def shape(self, name):
        return self.raws[name].shape

    def get_raw(self, name):
        return self.raws[name]

    def get(self, name, *, dtype=torch.float32, shape=None):
        raw = self.raws[name]
        return torch.arange(int(np.prod(raw.shape)), dtype=dtype).reshape(raw.shape)


def _q8(rows: int, cols: int) -> RawTensor:
    data = np.arange(rows * cols // 32 * 34, dtype=np.uint32).astype(np.uint8).reshape(rows, -1)
    return RawTensor(data, "Q8_0", (rows, cols))


def test_quantized_blocks_split_between_blocks_only():
    raw = _q8(4, 96)
    store = ShardedStore(_Store({"w": raw, "cut": raw}), {"w": Shard(1, 32, 64), "cut": Shard(1, 16, 48)})
    part = store.get_raw("w")
    assert part.shape == (4, 64) and store.shape("w") == (4, 64)
    assert np.array_equal(part.data, raw.data[:, 34:102])  # blocks 1 and 2 of every row
    with pytest.raises(ShapeMismatch, match=r"tensor 'cut' \(Q8_0.*cut its blocks of 32"):
        store.get_raw("cut")


def test_a_part_of_blocks_is_a_view_whose_source_names_the_part():
    """No byte is copied at load (a lazily repacked expert reads its pages on first use), and the
    repack cache keys each rank's part apart from the whole tensor and from the other ranks'."""
    raw = _q8(4, 96)._replace(source=RawSource("/m.gguf", 10, 3, "w", (4, 96)))
    columns = ShardedStore(_Store({"w": raw}), {"w": Shard(1, 32, 64)}).get_raw("w")
    rows = ShardedStore(_Store({"w": raw}), {"w": Shard(0, 2, 2)}).get_raw("w")
    assert np.shares_memory(columns.data, raw.data) and np.shares_memory(rows.data, raw.data)
    assert columns.source == RawSource("/m.gguf", 10, 3, "w@1:32+64", (4, 64))
    assert rows.source == RawSource("/m.gguf", 10, 3, "w@0:2+2", (2, 96))
    assert ShardedStore(_Store({"w": _q8(4, 96)}), {"w": Shard(0, 2, 2)}).get_raw("w").source is None


def test_rows_and_dense_columns_are_sliced_and_int8_keeps_its_blocks():
    raw = _q8(4, 96)
    store = ShardedStore(_Store({"w": raw}), {"w": Shard(0, 1, 2)})
    assert np.array_equal(store.get_raw("w").data, raw.data[1:3])
    dense = ShardedStore(_Store({"w": raw}), {"w": Shard(1, 16, 48)}, weight_format="exact")
    assert torch.equal(dense.get("w", shape=(4, 48)), torch.arange(384.0).reshape(4, 96)[:, 16:64])
    int8 = ShardedStore(_Store({"w": raw}), {"w": Shard(1, 16, 48)}, weight_format="int8")
    with pytest.raises(ShapeMismatch, match="'w' cannot be split for tensor parallelism in weight format int8"):
        int8.get("w")


def test_one_rank_layers_run_no_collective():
    tp = TensorParallel()
    assert not tp.enabled
    linear = RowParallelLinear(lambda x: 2 * x, tp, bias=torch.ones(3))
    assert torch.equal(linear(torch.ones(2, 3)), torch.full((2, 3), 3.0))
    assert torch.equal(tp.gather_last_dim(torch.ones(1, 5), (5,)), torch.ones(1, 5))
