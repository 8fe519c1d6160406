"""``LogRing``: a bounded ring buffer of log records, fed by a loguru sink, read by the logs pane.

Owner: ``met serve`` (the CLI layer, the only place that adds loguru sinks) installs
:meth:`LogRing.sink` while the dashboard runs; the logs pane polls :meth:`LogRing.since`.

Invariants:
- At most ``capacity`` records are kept; the oldest are dropped first.
- Every record gets a strictly increasing ``seq``, so a reader that remembers the last ``seq``
  it saw gets each record at most once, even across drops.
- The sink never blocks on the reader: one short lock around a deque append.
"""

from __future__ import annotations

import threading
from collections import deque
from datetime import datetime

from attrs import define, field, frozen

__all__ = ["LogRecord", "LogRing"]


@frozen
class LogRecord:
    seq: int
    time: datetime
    level: str
    message: str

    def line(self) -> str:
        return f"{self.time:%H:%M:%S} {self.level:<7} {self.message}"

    def matches(self, needle: str) -> bool:
        """Case-insensitive substring match on the level and the message."""
        if not needle:
            return True
        needle = needle.lower()
        return needle in self.message.lower() or needle in self.level.lower()


@define
class LogRing:
    capacity: int = 2000
    _records: deque = field(init=False)
    _lock: threading.Lock = field(init=False, factory=threading.Lock)
    _seq: int = field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        self._records = deque(maxlen=self.capacity)

    def append(self, level: str, message: str, when: datetime | None = None) -> None:
        with self._lock:
            self._seq += 1
            self._records.append(LogRecord(self._seq, when or datetime.now(), level, message))

    def sink(self, message) -> None:
        """A loguru sink: ``logger.add(ring.sink, level=..., format="{message}")``."""
        record = message.record
        text = record["message"]
        if record["exception"] is not None:
            text = f"{text} ({record['exception'].type.__name__}: {record['exception'].value})"
        self.append(record["level"].name, text, record["time"].replace(tzinfo=None))

    def since(self, seq: int) -> list[LogRecord]:
        """Records with ``seq`` greater than the given one, oldest first."""
        with self._lock:
            if not self._records or self._records[-1].seq <= seq:
                return []
            return [r for r in self._records if r.seq > seq]

    def all(self) -> list[LogRecord]:
        return self.since(0)
