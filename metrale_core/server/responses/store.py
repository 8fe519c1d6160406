"""The in-memory response store behind ``previous_response_id`` and ``GET``/``DELETE
/v1/responses/{id}``.

Owner: ``create_app`` makes one per app (``--responses-store-size``, default 1024); the Responses
routes put every response created with ``store: true`` (OpenAI's default) and read it back.

Invariants:
- Bounded: at most ``capacity`` responses; putting one more evicts the least recently used
  (a ``get`` counts as a use).  ``capacity`` 0 stores nothing.
- Lives only as long as the server process; nothing is written to disk.
- Each entry keeps the response body and the conversation (chat messages) it ended, so a
  follow-up continues it without the client resending the history.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from attrs import frozen

__all__ = ["ResponseStore", "StoredResponse"]


@frozen
class StoredResponse:
    body: dict[str, Any]
    #: The whole conversation up to and including this response's output, as chat messages.
    messages: tuple


class ResponseStore:
    """A bounded LRU map ``response id -> StoredResponse`` (see the module docstring)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(0, capacity)
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, response_id: str, entry: StoredResponse) -> None:
        if self.capacity == 0:
            return
        self._items[response_id] = entry
        self._items.move_to_end(response_id)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._items.get(response_id)
        if entry is not None:
            self._items.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        return self._items.pop(response_id, None) is not None
