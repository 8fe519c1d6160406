"""Data parallel: N engine replicas, each its own process, behind one server.

Owner: ``met serve --data-parallel-size N`` (``metrale_core.cli.serve``) builds a
:class:`ReplicaPool` as the server's engine front; see ``pool`` for the lifecycle and faults,
``routing`` for how requests are spread (load with prefix affinity), ``replica`` for the
process side, ``remote`` and ``link`` for replicas on other hosts (``met replica``) and
``metrics`` for ``/metrics``.

Invariants:
- The pool has ``AsyncEngine``'s interface, so the server's routes need no change for it.
- Nothing here imports the server, the CLI or a plugin (it sits over the engine).
"""

from __future__ import annotations

from metrale_core.dataparallel.pool import ReplicaFailed, ReplicaPool
from metrale_core.dataparallel.routing import PrefixRouter, Route, block_hashes

__all__ = ["PrefixRouter", "ReplicaFailed", "ReplicaPool", "Route", "block_hashes"]
