"""Metrale plugin: the ``ray`` executor (``--distributed-executor-backend ray``).

Owner: ``metrale_ray``.  Registers one executor through ``metrale_executors``; its factory
(``executor.RayExecutor``) imports Ray only when a job starts.

Invariants: this package imports neither torch nor Ray itself (``met plugins`` stays fast).
"""

from __future__ import annotations

from metrale_core.api import ExecutorSpec, lazy_factory, registers

__all__ = ["metrale_executors"]


#: The ``metrale_executors`` hook.  Register the ray executor.
metrale_executors = registers(
    ExecutorSpec(
        name="ray",
        factory=lazy_factory("metrale_ray.executor:RayExecutor"),
        description="tensor-parallel workers placed by Ray (ray.init(); RAY_ADDRESS for a cluster)",
    )
)
