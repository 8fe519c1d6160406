"""The on-disk cache of repacked GGUF records: a second build of the same tensors reads the records
back (no repacking) and multiplies bit-equal; a changed file, a shard (no source), a damaged entry
or a cache switched off never serve stale records; the directory keeps under its size limit."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from metrale_core.layers.formats import gguf_blocks as gb
from metrale_core.layers.formats import gguf_linear as gl
from metrale_core.layers.formats import gguf_repack as gr
from metrale_core.layers.formats import repack_cache
from metrale_core.testing import pytest_plugin
from metrale_core.testing.gguf_blocks import write_tensors
from metrale_core.weights.gguf_store import GGUFStore

N, K = 32, 256
NAMES = ("blk.0.a.weight", "blk.0.b.weight")

pytest_plugins = ["pytester"]


def _write(path, seed: int = 0):
    rng = np.random.default_rng(seed)
    kind = GGMLQuantizationType.Q8_0
    tensors = ((name, quantize(rng.standard_normal((N, K)).astype(np.float32), kind), kind) for name in NAMES)
    return write_tensors(path, tensors, K)


def _raw(path, name="a.weight"):
    store = GGUFStore(path)
    return store.get_raw(next(n for n, g in store.gguf_names.items() if g == f"blk.0.{name}"))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv(repack_cache.CACHE_ENV, str(root))
    if gl.gguf_kernel() is None:
        pytest.fail("the C GGUF kernel is not built: the cache serves only its records")
    return root


def _entries(root):
    return sorted(root.glob("*/*.bin"))


def _no_repacking(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("repacked although the records were cached")

    monkeypatch.setattr(gr, "decode", refuse)


def test_pytest_sessions_use_their_own_cache():
    assert pytest_plugin.REPACK_CACHE_ENV == repack_cache.CACHE_ENV
    assert os.environ[repack_cache.CACHE_ENV]  # set for the session (or by the caller)


def test_a_nested_session_leaves_the_outer_sessions_cache(pytester):
    """An in-process ``pytester`` session finds the variable set: at its end the outer session's
    cache directory and variable are still there (they once went, failing later tests)."""
    outer = os.environ[repack_cache.CACHE_ENV]
    existed = Path(outer).is_dir()
    pytester.makepyfile("def test_nothing():\n    pass\n")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert os.environ.get(repack_cache.CACHE_ENV) == outer
    assert Path(outer).is_dir() == existed


def test_a_second_build_reads_the_records_back(cache, tmp_path, monkeypatch):
    path = _write(tmp_path / "m.gguf")
    x = torch.randn(5, K, generator=torch.Generator().manual_seed(0))
    first = gl.gguf_linear([_raw(path), _raw(path, "b.weight")])
    assert len(_entries(cache)) == 1
    _no_repacking(monkeypatch)
    second = gl.gguf_linear([_raw(path), _raw(path, "b.weight")])
    assert torch.equal(first.weight.records, second.weight.records)
    assert torch.equal(first(x), second(x))


def test_a_changed_file_misses(cache, tmp_path):
    path = _write(tmp_path / "m.gguf")
    gl.gguf_linear([_raw(path)])
    _write(path, seed=1)  # new contents, new mtime
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    fresh = gl.gguf_linear([_raw(path)])
    assert len(_entries(cache)) == 2
    store = GGUFStore(path)
    weight = store.get(next(n for n, g in store.gguf_names.items() if g == "blk.0.a.weight"))
    x = torch.randn(3, K, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(fresh(x), x @ weight.T, rtol=0.01, atol=0.05)  # the new weights


def test_a_tensor_without_a_source_is_not_cached(cache, tmp_path):
    raw = _raw(_write(tmp_path / "m.gguf"))
    gl.gguf_linear([raw._replace(source=None)])
    assert not cache.exists() or not _entries(cache)


def test_a_damaged_entry_is_ignored_and_rewritten(cache, tmp_path, monkeypatch):
    path = _write(tmp_path / "m.gguf")
    good = gl.gguf_linear([_raw(path)]).weight.records.clone()
    (entry,) = _entries(cache)
    entry.write_bytes(entry.read_bytes()[:-7])
    again = gl.gguf_linear([_raw(path)]).weight.records
    assert torch.equal(again, good) and entry.stat().st_size == good.numel()


def test_off_means_no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(repack_cache.CACHE_ENV, "off")
    assert repack_cache.cache_dir() is None
    gl.gguf_linear([_raw(_write(tmp_path / "m.gguf"))])
    assert not (tmp_path / "cache").exists()


def test_the_cache_keeps_under_its_limit(cache, tmp_path, monkeypatch):
    path = _write(tmp_path / "m.gguf")
    one = gb.records_nbytes(gb.GGUF_KINDS["Q8_0"][0], N, K)
    monkeypatch.setenv(repack_cache.CACHE_MAX_ENV, str(one + one // 2))
    gl.gguf_linear([_raw(path)])
    oldest = _entries(cache)
    gl.gguf_linear([_raw(path, "b.weight")])
    left = _entries(cache)
    assert len(left) == 1 and left != oldest  # the least recently used entry went


def test_one_scan_per_process_until_the_limit(cache, tmp_path, monkeypatch):
    """The directory is scanned on this process's first write there, then only when the running
    total passes the limit: not once per tensor."""
    path = _write(tmp_path / "m.gguf")
    scans: list = []
    real = repack_cache._trim
    monkeypatch.setattr(repack_cache, "_trim", lambda root, limit: scans.append(root) or real(root, limit))
    one = gb.records_nbytes(gb.GGUF_KINDS["Q8_0"][0], N, K)
    monkeypatch.setenv(repack_cache.CACHE_MAX_ENV, str(3 * one))
    gl.gguf_linear([_raw(path)])
    gl.gguf_linear([_raw(path, "b.weight")])
    gl.gguf_linear([_raw(path), _raw(path, "b.weight")])  # the third entry passes the limit
    assert len(scans) == 2 and len(_entries(cache)) == 2


def _mapped_from(ptr: int, path) -> bool:
    """Whether address ``ptr`` lies in a mapping of the file ``path`` (``/proc/self/maps``)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].strip() == str(path):
            lo, hi = (int(v, 16) for v in fields[0].split("-"))
            if lo <= ptr < hi:
                return True
    return False


def test_a_hit_is_mapped_and_outlives_its_entry(cache, tmp_path, monkeypatch):
    """A warm build maps the entry (no copy); replacing and then trimming the entry leaves the
    mapped records, and the layer's output, as they were."""
    path = _write(tmp_path / "m.gguf")
    x = torch.randn(4, K, generator=torch.Generator().manual_seed(3))
    expected = gl.gguf_linear([_raw(path)])(x)
    (entry,) = _entries(cache)
    _no_repacking(monkeypatch)
    warm = gl.gguf_linear([_raw(path)])
    assert _mapped_from(warm.weight.records.data_ptr(), entry.resolve())
    key = entry.stem
    repack_cache.store(key, np.zeros(entry.stat().st_size, np.uint8))  # replaced (a new inode) ...
    entry.unlink()  # ... then trimmed
    assert torch.equal(warm(x), expected)


def test_a_miss_is_written_in_place(cache, tmp_path):
    """A cold build packs straight into the entry: its records are a mapping of the entry after
    the rename, the entry holds exactly them, and no temporary file is left."""
    path = _write(tmp_path / "m.gguf")
    layer = gl.gguf_linear([_raw(path), _raw(path, "b.weight")])
    (entry,) = _entries(cache)
    records = layer.weight.records
    assert _mapped_from(records.data_ptr(), entry.resolve())
    assert entry.read_bytes() == records.numpy().tobytes()
    assert not list(cache.glob("*/*.tmp"))


def test_a_cache_that_cannot_take_the_entry_falls_back_to_memory(cache, tmp_path, monkeypatch):
    """No room for the entry (the blocks cannot be allocated): the records are built in memory,
    bit-equal to a build without a cache, and nothing is left in the cache."""
    import errno

    path = _write(tmp_path / "m.gguf")

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    built = gl.gguf_linear([_raw(path)]).weight.records
    assert not _entries(cache) and not list(cache.glob("*/*.tmp"))
    monkeypatch.setenv(repack_cache.CACHE_ENV, "off")
    assert torch.equal(built, gl.gguf_linear([_raw(path)]).weight.records)


def test_without_posix_fallocate_the_records_are_stored_whole(cache, tmp_path, monkeypatch):
    """An OS without ``posix_fallocate`` (macOS, Windows) builds the records in memory and stores
    them at the end: the next build reads them back."""
    path = _write(tmp_path / "m.gguf")
    monkeypatch.delattr(os, "posix_fallocate")
    built = gl.gguf_linear([_raw(path)]).weight.records
    (entry,) = _entries(cache)
    assert not _mapped_from(built.data_ptr(), entry.resolve())
    assert entry.read_bytes() == built.numpy().tobytes()
    _no_repacking(monkeypatch)
    assert torch.equal(gl.gguf_linear([_raw(path)]).weight.records, built)


def test_a_failed_repack_leaves_no_temporary_file(cache, tmp_path, monkeypatch):
    path = _write(tmp_path / "m.gguf")

    def broken(*args, **kwargs):
        raise RuntimeError("decode failed")

    monkeypatch.setattr(gr, "decode", broken)
    with pytest.raises(RuntimeError, match="decode failed"):
        gl.gguf_linear([_raw(path)])
    assert not _entries(cache) and not list(cache.glob("*/*.tmp"))
