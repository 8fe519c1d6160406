"""Ranks 1..N-1 of a tensor-parallel job: load this rank's shard, then run every step rank 0 sends.

Owner: ``met worker`` (torchrun / the ``env`` executor), the ``mp`` executor's worker processes
and the ``ray`` plugin's actors all call :func:`run_worker`.

Invariants:
- The worker learns what to load and the job's ``--distributed-timeout`` from rank 0 (one
  broadcast on the setup group after the rendezvous): it needs no model flags of its own, only
  the torch.distributed variables.  With its load status it reports where it runs.
- Its KV cache is its own shard (its model's ``info.kv``) with rank 0's geometry (blocks, block
  size, storage dtype), allocated on the first step and reallocated only if that changes.
- It returns 0 after rank 0's ``stop``; a rank 0 that is gone or silent (no step and no
  heartbeat ``ping`` within the timeout, e.g. its host's link is down) or a failed step returns 1
  with the reason logged: a worker never waits for a lost job longer than the timeout.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from attrs import evolve
from loguru import logger

from metrale_core.model_api import PagedKVCache

__all__ = ["PARENT_ENV", "run_worker"]

#: Set by the ``mp`` executor: the server's pid; the worker exits when its parent changes.
PARENT_ENV = "METRALE_TP_PARENT"


def _exit_with_parent(env: Mapping[str, str]) -> None:
    """A worker of the ``mp`` executor never outlives its server (no orphans, even after SIGKILL)."""
    parent = env.get(PARENT_ENV)
    if not parent:
        return

    def watch() -> None:
        while os.getppid() == int(parent):
            time.sleep(0.2)
        logger.error("tensor-parallel worker: the server (pid {}) is gone; exiting", parent)
        os._exit(1)

    threading.Thread(target=watch, name="metrale-tp-parent", daemon=True).start()


def _ignore_interrupts() -> None:
    """Ctrl-C reaches the whole process group: a worker stops when rank 0 says so (or is gone)."""
    with contextlib.suppress(ValueError):  # not the main thread (a Ray actor): nothing to do
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_worker(env: Mapping[str, str] | None = None, registry: Any = None) -> int:
    """Join the job described by ``env`` (default: ``os.environ``) as a worker and serve it."""
    from metrale_core.loading.load import load_model
    from metrale_core.parallel.distributed import (
        device_for,
        join,
        leave,
        local_address,
        open_groups,
        rendezvous_from_env,
    )
    from metrale_core.parallel.driver import batch_to
    from metrale_core.plugin.components import LoadOptions

    _ignore_interrupts()
    _exit_with_parent(os.environ if env is None else env)
    rdv = rendezvous_from_env(env)
    box: list[Any] = [None]
    setup = join(rdv, device_for(os.environ.get("METRALE_TP_DEVICE", "cpu"), rdv.rank))
    try:
        dist.broadcast_object_list(box, src=0, group=setup)
        spec = box[0]
        if spec.get("threads"):
            torch.set_num_threads(int(spec["threads"]))
        device = device_for(spec["device"], rdv.rank)
        tp, control = open_groups(rdv, device, spec["timeout_s"])
        options = LoadOptions(
            dtype=spec["dtype"], device=device, weight_format=spec["weight_format"], tensor_parallel=tp
        )
        status: str | None = None
        model = None
        try:
            model = load_model(spec["model"], options, registry, progress=False).model
        except Exception as exc:
            status = f"rank {rdv.rank}: {type(exc).__name__}: {exc}"
        statuses: list[Any] = [None] * rdv.world
        dist.all_gather_object(statuses, (status, f"{local_address(rdv)}, pid {os.getpid()}"), group=setup)
        if model is None or any(s for s, _ in statuses):
            return 1
        logger.info("tensor parallel rank {}/{} ready: {}", rdv.rank, rdv.world, model)
        try:
            _serve(model, control, device, batch_to)
        except RuntimeError as exc:  # a collective failed or timed out
            first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            logger.error(
                "tensor-parallel worker rank {}: lost rank 0 at {}:{} (no answer within {:g}s, or a "
                "collective failed: {}); exiting",
                rdv.rank,
                rdv.addr,
                rdv.port,
                spec["timeout_s"],
                first,
            )
            return 1
        return 0
    finally:
        leave()


def _serve(model: Any, control: Any, device: str, batch_to: Any) -> None:
    kv: PagedKVCache | None = None
    geometry = None
    state = model.make_state_pool(0) if model.info.has_recurrent_state else None
    box: list[Any] = [None]
    while True:
        dist.broadcast_object_list(box, src=0, group=control)
        message = box[0]
        if message[0] == "stop":
            return
        if message[0] == "ping":  # rank 0's heartbeat while it idles
            dist.barrier(group=control)
            continue
        method, batch, wanted = message
        if wanted is not None and wanted != geometry:
            num_blocks, block_size, dtype = wanted
            layout = model.info.kv if dtype is None else evolve(model.info.kv, dtype=dtype)
            kv = PagedKVCache.allocate(layout, num_blocks, block_size, device=device)
            geometry = wanted
        with torch.no_grad():
            getattr(model, method)(batch_to(batch, device), kv, state)
