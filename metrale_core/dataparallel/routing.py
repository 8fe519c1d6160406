"""``PrefixRouter``: which data-parallel replica gets a request (load, with prefix affinity).

Owner: ``ReplicaPool.generate`` asks :meth:`PrefixRouter.route` once per engine request.

How affinity and load are balanced:
- A prompt is cut into full blocks of ``block_size`` tokens (the engines' KV block size, the
  prefix cache's unit); each block gets a chained hash (the hash of the block and everything
  before it).  After routing, every block hash of the prompt is recorded as held by the chosen
  replica (an LRU map of at most ``capacity`` hashes).
- The *holder* of a prompt is the replica recorded for its longest recorded prefix (scanning
  from the last full block backwards).  A conversation's next turn starts with the previous
  turn's prompt, so its holder is the replica that served that turn.
- Load is the number of engine requests in flight per replica, counted by the front (exact and
  immediate, unlike the replicas' own reports).  The holder wins while its load is at most
  ``slack`` above the least-loaded replica's; otherwise (or with no holder) the least-loaded
  replica wins, ties broken round-robin so an idle pool alternates.  A shared prefix (one system
  prompt for everyone) therefore never skews the load by more than ``slack`` requests, and the
  longer, conversation-specific prefixes keep their own holders.

Invariants:
- Only replicas in ``loads`` (the ones up) are ever chosen; a holder that is down is ignored.
- Deterministic for a given history of calls (no randomness, no clocks).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence

from attrs import frozen

__all__ = ["PrefixRouter", "Route", "block_hashes"]


def block_hashes(prompt_ids: Sequence[int], block_size: int) -> list[int]:
    """The chained hash of each full ``block_size`` block of ``prompt_ids``."""
    hashes: list[int] = []
    prev = 0
    for start in range(0, len(prompt_ids) - block_size + 1, block_size):
        prev = hash((prev, tuple(prompt_ids[start : start + block_size])))
        hashes.append(prev)
    return hashes


@frozen
class Route:
    """One routing decision."""

    replica: int
    #: Full blocks of the prompt already held by ``replica`` (0: no affinity used).
    matched_blocks: int
    #: The holder's prefix decided it (False: the least-loaded replica).
    affinity: bool


class PrefixRouter:
    """See the module docstring."""

    def __init__(self, block_size: int, slack: int = 4, capacity: int = 1 << 16) -> None:
        if block_size < 1 or slack < 0 or capacity < 1:
            raise ValueError("block_size and capacity must be >= 1 and slack >= 0")
        self.block_size = block_size
        self.slack = slack
        self.capacity = capacity
        self._holder: OrderedDict[int, int] = OrderedDict()
        self._turn = 0

    def route(self, prompt_ids: Sequence[int], loads: Mapping[int, int]) -> Route:
        """Choose a replica among ``loads`` (replica -> engine requests in flight) and record
        the prompt's blocks as held by it."""
        if not loads:
            raise ValueError("no replica to route to")
        hashes = block_hashes(prompt_ids, self.block_size)
        holder, matched = None, 0
        for k in range(len(hashes) - 1, -1, -1):
            replica = self._holder.get(hashes[k])
            if replica is not None and replica in loads:
                holder, matched = replica, k + 1
                break
        least = min(loads.values())
        if holder is not None and loads[holder] <= least + self.slack:
            choice = Route(holder, matched, True)
        else:
            idle = sorted(r for r, n in loads.items() if n == least)
            pick = idle[self._turn % len(idle)]
            self._turn += 1
            choice = Route(pick, matched if pick == holder else 0, False)
        self._record(hashes, choice.replica)
        return choice

    def _record(self, hashes: list[int], replica: int) -> None:
        held = self._holder
        for h in hashes:
            held[h] = replica
            held.move_to_end(h)
        while len(held) > self.capacity:
            held.popitem(last=False)
