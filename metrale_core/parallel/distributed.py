"""Rendezvous and process groups of one tensor-parallel job (the torch.distributed environment).

Owner: ``metrale_core.parallel``; rank 0 (``launch``) and every worker (``worker``) call
:func:`join` with the same ``MASTER_ADDR`` / ``MASTER_PORT`` / ``WORLD_SIZE`` and their ``RANK``
(torchrun's variables; the ``mp`` and ``ray`` executors set them for the workers they start).

Invariants:
- Two groups: the forward's collectives (``TensorParallel.group``: gloo on CPU, NCCL on CUDA;
  a stuck collective fails after ``$METRALE_TP_TIMEOUT`` seconds, default 300) and a gloo control
  group for the step broadcast, which waits as long as the server idles.
- A worker on CUDA uses device ``cuda:$LOCAL_RANK`` (else ``cuda:$RANK``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from attrs import frozen

from metrale_core.errors import ConfigError
from metrale_core.layers.parallel import TensorParallel

__all__ = ["ENV_KEYS", "Rendezvous", "join", "leave", "rendezvous_from_env", "step_timeout"]

ENV_KEYS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
_IDLE = timedelta(days=365)


def step_timeout() -> timedelta:
    """How long one collective of the forward may wait for the other ranks."""
    return timedelta(seconds=float(os.environ.get("METRALE_TP_TIMEOUT", "300")))


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


def join(rdv: Rendezvous, device: str = "cpu") -> tuple[TensorParallel, Any]:
    """Join the job: ``(TensorParallel of the forward, the control group)``."""
    on_cuda = torch.device(device).type == "cuda"
    if on_cuda:
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group(
        "nccl" if on_cuda else "gloo",
        init_method=f"tcp://{rdv.addr}:{rdv.port}",
        rank=rdv.rank,
        world_size=rdv.world,
        timeout=step_timeout(),
    )
    control = dist.new_group(backend="gloo", timeout=_IDLE)
    return TensorParallel(rdv.rank, rdv.world, dist.group.WORLD), control


def leave() -> None:
    """Tear the groups down (no-op when not joined)."""
    if dist.is_initialized():
        dist.destroy_process_group()
