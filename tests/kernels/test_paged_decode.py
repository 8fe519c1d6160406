"""Tests of ``metrale_core.kernels.paged_decode``: the launch of a paged decode-attention kernel
(grid, block and argument order of the core's decode ABI), checked on CPU with a recording op."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from metrale_core.kernels import paged_decode


class _RecordingOp:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def kernel(self, function: str):
        def launch(grid, block, args):
            self.calls.append((function, grid, block, args))

        return launch


@pytest.mark.parametrize("with_scales", [False, True])
def test_launch_passes_the_decode_abi_in_order(monkeypatch, with_scales):
    streams: list[torch.device] = []

    @contextlib.contextmanager
    def fake_stream(device):
        streams.append(device)
        yield

    monkeypatch.setattr(paged_decode, "torch_stream", fake_stream)
    q = torch.zeros(3, 8, 16)  # B=3, Hq=8, d=16
    k_cache = torch.zeros(5, 4, 2, 16)  # 5 blocks of 4 positions, Hk=2
    v_cache = torch.zeros_like(k_cache)
    tables = torch.zeros(3, 7, dtype=torch.int64)
    lens = torch.zeros(3, dtype=torch.int64)
    scales = (torch.ones(2), torch.ones(2)) if with_scales else ()
    op = _RecordingOp()
    out = paged_decode.launch_paged_decode(op, "decode_f32", q, k_cache, v_cache, tables, lens, 0.25, scales)
    assert out.shape == q.shape and out.dtype == q.dtype and out.data_ptr() != q.data_ptr()
    assert streams == [q.device]
    [(function, grid, block, args)] = op.calls
    assert (function, grid, block) == ("decode_f32", (8, 3), (128,))
    pointers = [out, q, k_cache, v_cache, *scales, tables, lens]
    assert [int(a) for a in args[: len(pointers)]] == [t.data_ptr() for t in pointers]
    assert all(isinstance(a, np.uint64) for a in args[: len(pointers)])
    rest = args[len(pointers) :]
    assert isinstance(rest[0], np.float32) and float(rest[0]) == 0.25
    assert [int(a) for a in rest[1:]] == [8, 2, 16, 4, 7]  # Hq, Hk, d, block size, max blocks
    assert all(isinstance(a, np.int32) for a in rest[1:])
