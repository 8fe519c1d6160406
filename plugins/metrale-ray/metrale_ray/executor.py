"""``RayExecutor``: ranks 1..N-1 of a tensor-parallel job as Ray actors.

Owner: ``metrale_ray``; built by ``metrale_core.parallel.launch`` when
``--distributed-executor-backend ray`` is given.

Each worker is one actor (``num_cpus`` 1 unless ``$METRALE_RAY_NUM_CPUS`` says otherwise) placed
by Ray -- on this machine, or on any node of the cluster ``ray.init`` joins (``$RAY_ADDRESS``).
The actor runs ``metrale_core.api.run_worker`` with the torch.distributed variables of its rank;
rank 0 (the server) listens on this node's address.  The collectives are torch.distributed's
(gloo / NCCL), not Ray's: Ray only places and supervises the processes.

Invariants:
- ``poll`` reports an actor whose ``run`` ended (an error, or its process died) with its rank.
- An actor whose job is lost (``run_worker`` returns non-zero: rank 0 silent past
  ``--distributed-timeout``, e.g. its node's link is down) ends its own process: a worker on a
  node cut off from the server does not wait for a kill that cannot reach it.
- ``shutdown`` waits for the actors' ``run`` after rank 0's stop, then kills every actor: no
  worker outlives the job.  Ray itself is left running if it was running before (a cluster),
  and shut down if this executor started it (from the main thread only: see ``_disconnect``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

from metrale_core.api import ConfigError, Rendezvous, free_port

__all__ = ["RayExecutor"]


def _run(env: dict[str, str]) -> int:  # pragma: no cover - runs inside the actor
    os.environ.update(env)
    from metrale_core.api import run_worker

    code = run_worker(env)
    if code != 0:  # the job is lost (rank 0 silent past the timeout, or a failed step): its owner
        os._exit(code)  # may be unreachable and never kill this actor, so leave no idle actor behind
    return code


class RayExecutor:
    """Workers as Ray actors (see the module docstring)."""

    def __init__(self) -> None:
        self.actors: dict[int, Any] = {}
        self.runs: dict[int, Any] = {}
        self._started_ray = False

    def launch(self, world: int) -> Rendezvous:
        try:
            import ray
        except ImportError as exc:
            raise ConfigError("the 'ray' executor needs Ray: pip install ray") from exc
        if not ray.is_initialized():
            ray.init(
                address=os.environ.get("RAY_ADDRESS"),
                log_to_driver=False,
                runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}},
            )
            self._started_ray = True
        host = ray.util.get_node_ip_address()
        rdv = Rendezvous(host, free_port(host), world, 0)
        num_cpus = float(os.environ.get("METRALE_RAY_NUM_CPUS", "1"))
        worker: Any = ray.remote(num_cpus=num_cpus, max_restarts=0)(_Actor)
        forwarded = {k: v for k, v in os.environ.items() if k.startswith(("METRALE_", "OMP_"))}
        for rank in range(1, world):
            actor: Any = worker.remote()
            self.actors[rank] = actor
            self.runs[rank] = actor.run.remote({**forwarded, **rdv.env(rank)})
        return rdv

    def poll(self) -> str | None:
        import ray

        for rank, ref in self.runs.items():
            done, _ = ray.wait([ref], timeout=0)
            if done:
                try:
                    code = ray.get(ref)
                except Exception as exc:  # an actor that died or raised
                    return f"tensor-parallel worker rank {rank} (Ray actor) died: {type(exc).__name__}"
                return f"tensor-parallel worker rank {rank} (Ray actor) exited ({code})"
        return None

    def shutdown(self, timeout: float) -> None:
        import ray

        if not ray.is_initialized():
            return
        if self.runs:
            ray.wait(list(self.runs.values()), num_returns=len(self.runs), timeout=timeout)
        for actor in self.actors.values():
            ray.kill(actor)
        self.actors.clear()
        self.runs.clear()
        if self._started_ray:
            _disconnect(ray)


def _disconnect(ray: Any) -> None:
    """``ray.shutdown()``, keeping the process's SIGTERM handler: Ray's shutdown resets it to the
    default (the server would then die on SIGTERM instead of stopping), and only the main thread
    may set it back.  Off the main thread (a failed job reaped while the server goes on) the
    driver stays connected until the process exits, which disconnects it all the same."""
    if threading.current_thread() is not threading.main_thread():
        return
    handler = signal.getsignal(signal.SIGTERM)
    ray.shutdown()
    if handler is not None:
        signal.signal(signal.SIGTERM, handler)


class _Actor:
    """One worker rank; ``run`` returns when rank 0 stops the job."""

    def run(self, env: dict[str, str]) -> int:
        return _run(env)
