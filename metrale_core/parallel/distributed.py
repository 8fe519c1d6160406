"""Rendezvous and process groups of one tensor-parallel job (the torch.distributed environment).

Owner: ``metrale_core.parallel``; rank 0 (``launch``) and every worker (``worker``) call
:func:`join` with the same ``MASTER_ADDR`` / ``MASTER_PORT`` / ``WORLD_SIZE`` and their ``RANK``
(torchrun's variables; the ``mp`` and ``ray`` executors set them for the workers they start).

Invariants:
- Three groups.  :func:`join` makes the *setup* group (gloo, :data:`SETUP_TIMEOUT`): the
  rendezvous, the load spec and the load statuses, which may wait as long as the slowest rank
  starts or loads.  :func:`open_groups` then makes, with the job's ``--distributed-timeout``
  (rank 0 sends it in the load spec, so every rank uses the same), the forward's group
  (``TensorParallel.group``: gloo on CPU, NCCL on CUDA) and a gloo *control* group for the step
  broadcast and rank 0's heartbeat: any collective of a running job that waits longer than that
  raises, so a lost host (a link down kills no process) is noticed in bounded time on every side.
- A worker on CUDA uses device ``cuda:$LOCAL_RANK`` (else ``cuda:$RANK``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from attrs import frozen

from metrale_core.errors import ConfigError
from metrale_core.layers.parallel import TensorParallel

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "ENV_KEYS",
    "SETUP_TIMEOUT",
    "Rendezvous",
    "join",
    "leave",
    "local_address",
    "open_groups",
    "rendezvous_from_env",
]

ENV_KEYS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
#: ``--distributed-timeout``'s default: how long a collective of a running job waits for a rank.
DEFAULT_TIMEOUT_S = 60.0
#: How long the rendezvous and the load wait for the slowest rank.
SETUP_TIMEOUT = timedelta(hours=1)


@frozen
class Rendezvous:
    """Where the ranks of one job meet, and this process's rank."""

    addr: str
    port: int
    world: int
    rank: int

    def env(self, rank: int) -> dict[str, str]:
        """The torch.distributed variables of ``rank`` in this job."""
        return {
            "MASTER_ADDR": self.addr,
            "MASTER_PORT": str(self.port),
            "WORLD_SIZE": str(self.world),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
        }


def rendezvous_from_env(env: Mapping[str, str] | None = None) -> Rendezvous:
    """The job described by torchrun's variables; a ``ConfigError`` naming what is missing."""
    env = os.environ if env is None else env
    missing = [k for k in ENV_KEYS if not env.get(k)]
    if missing:
        raise ConfigError(
            f"the torch.distributed environment lacks {', '.join(missing)} (set "
            f"MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK, or run under torchrun)"
        )
    try:
        return Rendezvous(env["MASTER_ADDR"], int(env["MASTER_PORT"]), int(env["WORLD_SIZE"]), int(env["RANK"]))
    except ValueError as exc:
        raise ConfigError(f"bad torch.distributed environment: {exc}") from None


def device_for(device: str, rank: int) -> str:
    """This rank's device: ``cuda`` becomes ``cuda:$LOCAL_RANK``; CPU stays CPU."""
    if torch.device(device).type != "cuda":
        return device
    return f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}"


def local_address(rdv: Rendezvous) -> str:
    """This host's address on the route to rank 0 (how the other ranks name this one)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((rdv.addr, rdv.port))  # UDP: no packet is sent
            return str(sock.getsockname()[0])
    except OSError:
        return socket.gethostname()


def join(rdv: Rendezvous, device: str = "cpu") -> Any:
    """Join the job (the rendezvous): the setup group."""
    on_cuda = torch.device(device).type == "cuda"
    if on_cuda:
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group(
        "nccl" if on_cuda else "gloo",
        init_method=f"tcp://{rdv.addr}:{rdv.port}",
        rank=rdv.rank,
        world_size=rdv.world,
        timeout=SETUP_TIMEOUT,
    )
    return dist.new_group(backend="gloo", timeout=SETUP_TIMEOUT)


def open_groups(rdv: Rendezvous, device: str, timeout_s: float) -> tuple[TensorParallel, Any]:
    """The running job's groups, whose collectives fail after ``timeout_s``:
    ``(TensorParallel of the forward, the control group)``."""
    timeout = timedelta(seconds=timeout_s)
    backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
    forward = dist.new_group(backend=backend, timeout=timeout)
    control = dist.new_group(backend="gloo", timeout=timeout)
    return TensorParallel(rdv.rank, rdv.world, forward), control


def leave() -> None:
    """Tear the groups down (no-op when not joined)."""
    if dist.is_initialized():
        dist.destroy_process_group()
