"""An on-disk cache of GGUF tensors repacked into the C block kernel's layout.

Owner: ``metrale_core.layers`` (:func:`metrale_core.layers.formats.gguf_repack.repack` reads and fills
it).  Repacking a 0.5B model's blocks takes seconds of numpy at every start; a second start of
the same file reads the records back instead (``met serve`` on Qwen2.5-Coder-0.5B: /health in
about half the time).

Invariants:
- A record set is keyed by everything it is a function of: the layout version, the kernel kind,
  and per source tensor its file (resolved path, size, modification time), name and shape.  A
  changed file, or tensors without a source, never hit (a tensor-parallel part's source names
  the part: ``ShardedStore``); a changed layout bumps :data:`LAYOUT_VERSION`.
- Entries are written to a temporary file and renamed into place, so a reader never sees a
  partial entry (two processes may write the same entry; the last rename wins, both whole).  An
  entry of the wrong size is ignored and rewritten.
- A miss is filled in place (:func:`reserve`): the repack writes its records straight into a
  shared mapping of the temporary file, whose blocks are allocated first (``posix_fallocate``, so
  a full disk is an ``OSError`` and an anonymous buffer, never a ``SIGBUS`` later; where the OS
  has no ``posix_fallocate`` the records are built in memory and stored whole), and the
  process serves from that mapping after the rename: no second copy and no ``write`` of the
  records (Qwen2.5-Coder-0.5B: 0.9 s of a first load was writing them, 0.5 s joining chunks).
- A hit is mapped, not read (private copy-on-write mapping, never written): a warm start costs
  no copy and no fresh anonymous pages (Qwen2.5-Coder-0.5B: 0.1 s for 620 MB of records, against
  0.9 s reading them), the pages are the page cache's (shared by every process serving the
  file, reclaimable under memory pressure), and a mapping outlives its entry being replaced or
  trimmed (rename and unlink leave the mapped inode alone).
- The directory stays under ``METRALE_REPACK_CACHE_MAX`` bytes (default 8 GiB): when a write
  takes this process's running total of it (its size at the process's last scan plus what the
  process wrote since) past the limit, it is rescanned and the least recently used entries go.
  (One scan per load, not one per tensor; another process's writes are seen at the next scan.)
  ``METRALE_REPACK_CACHE=off`` disables the cache; any other value is its directory (default
  ``~/.cache/metrale/repack``).  A cache that cannot be read or written is skipped with a DEBUG
  line, never an error.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from loguru import logger

__all__ = [
    "CACHE_ENV",
    "CACHE_MAX_ENV",
    "LAYOUT_VERSION",
    "Reservation",
    "cache_dir",
    "cache_key",
    "file_key",
    "load",
    "reserve",
    "store",
]

CACHE_ENV = "METRALE_REPACK_CACHE"
CACHE_MAX_ENV = "METRALE_REPACK_CACHE_MAX"
#: Bump when the record layout of ``gguf_qmatmul.c`` (or ``gguf_blocks.pack``) changes.
LAYOUT_VERSION = 1
_DEFAULT_MAX = 8 << 30
_OFF = {"0", "off", "false", "no", "none"}


def cache_dir() -> Path | None:
    """The cache directory, or None when ``METRALE_REPACK_CACHE`` turns the cache off."""
    raw = os.environ.get(CACHE_ENV, "").strip()
    if raw.lower() in _OFF:
        return None
    return Path(raw).expanduser() if raw else Path.home() / ".cache" / "metrale" / "repack"


def cache_key(sources: Sequence[Any], kind: int, extra: Sequence[int] = ()) -> str | None:
    """The key of the records of ``sources`` (each a ``RawSource``; None: not cacheable)."""
    if not sources or any(s is None for s in sources):
        return None
    parts = [f"v{LAYOUT_VERSION}", f"k{kind}", *(str(e) for e in extra)]
    for s in sources:
        parts.append(f"{s.path}|{s.size}|{s.mtime_ns}|{s.name}|{'x'.join(map(str, s.shape))}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def file_key(path: Path, *extra: str) -> str | None:
    """The key of a small result derived from the whole file ``path`` (its path, size and
    modification time) and ``extra`` (what else it depends on); None when the file is not there."""
    try:
        st = path.stat()
    except OSError:
        return None
    parts = [f"v{LAYOUT_VERSION}", f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}", *extra]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _entry(root: Path, key: str) -> Path:
    return root / key[:2] / f"{key}.bin"


def load(key: str | None, nbytes: int) -> np.ndarray | None:
    """The cached records of ``key`` (``nbytes`` uint8, mapped from the entry), or None."""
    root = cache_dir()
    if key is None or root is None:
        return None
    path = _entry(root, key)
    try:
        if path.stat().st_size != nbytes:
            return None
        data = np.memmap(path, dtype=np.uint8, mode="c")
        os.utime(path)  # least recently used goes first
    except (OSError, ValueError):
        return None
    return data if data.size == nbytes else None


def store(key: str | None, records: np.ndarray) -> None:
    """Write ``records`` as the entry of ``key`` (atomically), then keep the cache to its limit."""
    root = cache_dir()
    if key is None or root is None:
        return
    path = _entry(root, key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(np.ascontiguousarray(records, dtype=np.uint8).data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _written(root, records.nbytes)
    except OSError as exc:
        logger.debug("repack cache: cannot write {}: {}", path, exc)


class Reservation:
    """Records being written: :attr:`records` (``nbytes`` uint8, writable) is a shared mapping of
    the entry's temporary file, or plain memory when there is no cache (or it cannot take the
    entry); :meth:`commit` renames the file into place (or, given ``key``, stores the records
    from memory), :meth:`discard` drops it."""

    def __init__(
        self,
        records: np.ndarray,
        root: Path | None = None,
        tmp: str | None = None,
        path: Path | None = None,
        key: str | None = None,
    ) -> None:
        self.records, self._root, self._tmp, self._path, self._key = records, root, tmp, path, key

    def commit(self) -> None:
        if self._key is not None:
            key, self._key = self._key, None
            store(key, self.records)
            return
        if self._tmp is None or self._path is None or self._root is None:
            return
        tmp, self._tmp = self._tmp, None
        try:
            os.replace(tmp, self._path)
        except OSError as exc:
            logger.debug("repack cache: cannot write {}: {}", self._path, exc)
            Path(tmp).unlink(missing_ok=True)
            return
        _written(self._root, self.records.nbytes)

    def discard(self) -> None:
        if self._tmp is not None:
            Path(self._tmp).unlink(missing_ok=True)
            self._tmp = None


def reserve(key: str | None, nbytes: int) -> Reservation:
    """Where to write the ``nbytes`` records of ``key``: in place in the cache when it can take
    them (see the invariants), else in memory."""
    root = cache_dir()
    if key is None or root is None or nbytes == 0:
        return Reservation(np.empty(nbytes, dtype=np.uint8))
    if not hasattr(os, "posix_fallocate"):  # macOS, Windows: in memory, stored whole at commit
        return Reservation(np.empty(nbytes, dtype=np.uint8), key=key)
    path = _entry(root, key)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        try:
            os.posix_fallocate(fd, 0, nbytes)
        finally:
            os.close(fd)
        records = np.memmap(tmp, dtype=np.uint8, mode="r+", shape=(nbytes,))
    except (OSError, ValueError) as exc:
        logger.debug("repack cache: cannot write {}: {}", path, exc)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        return Reservation(np.empty(nbytes, dtype=np.uint8))
    return Reservation(records, root, tmp, path)


#: Per cache directory: its bytes at this process's last scan plus what this process wrote since.
_totals: dict[Path, int] = {}
_totals_lock = threading.Lock()


def _written(root: Path, nbytes: int) -> None:
    """Account ``nbytes`` just written to ``root``; rescan and trim it only when the running total
    passes the limit (or on this process's first write there), not after every write."""
    limit = int(os.environ.get(CACHE_MAX_ENV) or _DEFAULT_MAX)
    with _totals_lock:
        total = _totals.get(root)
        if total is None or total + nbytes > limit:
            _totals[root] = _trim(root, limit)
        else:
            _totals[root] = total + nbytes


def _trim(root: Path, limit: int) -> int:
    """Remove the least recently used entries of ``root`` until it holds at most ``limit`` bytes;
    returns what it holds then."""
    entries = []
    for p in root.glob("*/*.bin"):
        try:
            st = p.stat()
        except OSError:
            continue
        entries.append((st.st_mtime_ns, st.st_size, p))
    total = sum(size for _, size, _ in entries)
    for _, size, p in sorted(entries, key=lambda e: e[0]):
        if total <= limit:
            break
        p.unlink(missing_ok=True)
        total -= size
    return total
