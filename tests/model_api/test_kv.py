"""``metrale_core.model_api.kv``: the storage: a CPU KV pool is zeroed, writable and committed only as
its blocks are written (``zeroed_pages``), so an idle server's pool costs no resident memory."""

from __future__ import annotations

import ctypes
import mmap

import pytest
import torch

from metrale_core.model_api.kv import KVLayout, PagedKVCache, zeroed_pages


def _resident_kib(tensor: torch.Tensor) -> int:
    """Resident KiB of the pages under ``tensor``'s bytes (``mincore``: exact for this range, where
    a mapping's ``Rss`` in ``/proc/self/smaps`` counts whatever the kernel merged beside it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page = mmap.PAGESIZE
    start = tensor.data_ptr() // page * page
    length = tensor.data_ptr() + tensor.numel() * tensor.element_size() - start
    pages = -(-length // page)
    vec = (ctypes.c_ubyte * pages)()
    if libc.mincore(start, length, vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore failed")
    return sum(b & 1 for b in vec) * page // 1024


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.uint8])
def test_zeroed_pages_are_zero_writable_and_separate(dtype):
    a, b = zeroed_pages((8, 16, 2, 64), dtype), zeroed_pages((8, 16, 2, 64), dtype)
    assert a.dtype == dtype and a.shape == (8, 16, 2, 64) and a.is_contiguous()
    assert not a.any() and not b.any()
    a[3, 5] = 7
    assert a[3, 5].eq(7).all() and not b.any() and int(a.ne(0).sum()) == 2 * 64


def test_a_kv_pool_is_resident_only_where_written():
    layout = KVLayout(num_layers=2, num_kv_heads=2, head_dim=64, dtype=torch.float32)
    cache = PagedKVCache.allocate(layout, num_blocks=4096, block_size=16)  # 2 layers x K, V x 32 MiB
    k = cache.k[0]
    assert k.numel() * 4 == 32 << 20
    assert _resident_kib(k) < 1024  # nothing written yet
    slots = torch.arange(64 * 16)  # the first 64 blocks: 512 KiB of K
    cache.write(0, slots, torch.ones(len(slots), 2, 64), torch.ones(len(slots), 2, 64))
    assert 512 <= _resident_kib(k) <= 4096  # up to two 2 MiB pages where transparent huge pages are on
    assert k[:64].eq(1).all() and not k[64:].any() and not cache.k[1].any()
