"""The built-in executors: where the ranks of a tensor-parallel job run.

Owner: ``metrale_core.plugin.builtins`` registers them (``metrale_executors``); ``launch.load_parallel``
calls the one ``--distributed-executor-backend`` names.  An executor (a plugin's too, e.g.
``metrale-ray``) has three methods:

- ``launch(world) -> Rendezvous``: start ranks 1..world-1 (each runs
  ``metrale_core.parallel.worker.run_worker`` with ``Rendezvous.env(rank)``) and return rank 0's
  rendezvous;
- ``poll() -> str | None``: why a rank is gone (None while all run); called every 0.2 s;
- ``shutdown(timeout)``: after rank 0 told the workers to stop, wait for them up to ``timeout``
  seconds, then kill what is left: no worker outlives the server.

``uni``: one process, no workers (tensor parallel size 1).  ``mp``: worker processes on this
machine (``python -m metrale_core worker``, the default for a size above 1), tied to the server
(``$METRALE_TP_PARENT``: a worker whose parent is gone exits at once, even if the server was
killed with SIGKILL).  ``env``: the ranks are
started by someone else (torchrun, or ``met worker`` by hand on other machines) and rank 0 reads
the torch.distributed variables; it can only see a lost rank through a failed collective.

Invariants: ``launch`` never blocks on the workers (the rendezvous does); a worker process that
exits before ``shutdown`` is reported by ``poll`` with its exit code.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from metrale_core.errors import ConfigError
from metrale_core.parallel.distributed import Rendezvous, rendezvous_from_env
from metrale_core.parallel.worker import PARENT_ENV

__all__ = ["EnvExecutor", "MpExecutor", "UniExecutor", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class UniExecutor:
    """Today's single process: only a tensor parallel size of 1."""

    def launch(self, world: int) -> Rendezvous:
        if world != 1:
            raise ConfigError(
                f"the 'uni' executor runs one process; --tensor-parallel-size {world} needs "
                f"'mp' (this machine), 'env' (torchrun) or 'ray'"
            )
        return Rendezvous("127.0.0.1", 0, 1, 0)

    def poll(self) -> str | None:
        return None

    def shutdown(self, timeout: float) -> None:
        return None


class MpExecutor:
    """Worker processes on this machine, one per rank above 0."""

    def __init__(self) -> None:
        self.procs: dict[int, subprocess.Popen] = {}

    def launch(self, world: int) -> Rendezvous:
        rdv = Rendezvous("127.0.0.1", free_port(), world, 0)
        for rank in range(1, world):
            env = {**os.environ, **rdv.env(rank), PARENT_ENV: str(os.getpid())}
            self.procs[rank] = subprocess.Popen(
                [sys.executable, "-m", "metrale_core", "worker"], env=env, stdin=subprocess.DEVNULL
            )
        return rdv

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values()]

    def poll(self) -> str | None:
        for rank, proc in self.procs.items():
            code = proc.poll()
            if code is not None:
                how = f"signal {-code}" if code < 0 else f"exit code {code}"
                return f"tensor-parallel worker rank {rank} (pid {proc.pid}) died ({how})"
        return None

    def shutdown(self, timeout: float) -> None:
        for proc in self.procs.values():
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class EnvExecutor:
    """Ranks started elsewhere (torchrun, ``met worker``): rank 0 reads the environment."""

    def launch(self, world: int) -> Rendezvous:
        rdv = rendezvous_from_env()
        if rdv.rank != 0:
            raise ConfigError(
                f"met serve / generate is rank 0 of a tensor-parallel job, but RANK is "
                f"{rdv.rank}; run 'met worker' on the other ranks"
            )
        if rdv.world != world:
            raise ConfigError(f"WORLD_SIZE is {rdv.world} but --tensor-parallel-size is {world}")
        return rdv

    def poll(self) -> str | None:
        return None

    def shutdown(self, timeout: float) -> None:
        return None
