"""metrale_core.pools: one pool made on first use, shared by concurrent callers."""

from __future__ import annotations

import threading

from metrale_core.pools import LazyThreadPool


def test_pool_is_made_once_and_shared_by_concurrent_callers() -> None:
    sizes: list[int] = []

    def workers() -> int:
        sizes.append(3)
        return 3

    lazy = LazyThreadPool(workers, "test-pool")
    assert sizes == []  # nothing is made before the first call
    got = []
    start = threading.Barrier(8)

    def ask() -> None:
        start.wait()
        got.append(lazy.get())

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sizes == [3]
    assert len({id(p) for p in got}) == 1
    names = set(got[0].map(lambda _: threading.current_thread().name, range(6)))
    assert names and all(n.startswith("test-pool") for n in names)
    assert got[0]._max_workers == 3
    got[0].shutdown()


def test_a_fixed_worker_count() -> None:
    lazy = LazyThreadPool(2, "fixed")
    pool = lazy.get()
    assert pool is lazy.get() and pool._max_workers == 2
    pool.shutdown()
