"""What the CLI calls to load a model over ``--tensor-parallel-size`` ranks.

Owner: ``met serve`` / ``met generate`` (through :func:`load_for_engine`) and the tests.

Invariants:
- Size 1 with the ``uni`` (or default) executor is exactly ``loading.load_model``: no process
  group, no wrapper.
- Otherwise rank 0 starts the workers through the executor, sends them what to load (and the
  job's ``--distributed-timeout``), loads its own shard and waits for every rank's load: a rank
  that cannot load (a tensor that cannot be split, a loader without tensor parallelism) fails
  the whole start with its reason.  Each worker reports where it runs (its address and pid), so
  a later failure names the lost rank's host.
- Tensor parallelism refuses what it does not shard: LoRA adapters, speculative decoding and
  KV codecs other than plain storage (``ConfigError`` naming the flag).
"""

from __future__ import annotations

import atexit
import os
from pathlib import Path
from typing import Any

from attrs import evolve
from loguru import logger

from metrale_core.errors import ConfigError
from metrale_core.loading.load import LoadedModel, load_model, resolve_model_path
from metrale_core.plugin.components import LoadOptions

__all__ = ["DEFAULT_BACKEND", "check_engine_config", "load_parallel", "parallel_driver"]

#: The executor when none is named: ``uni`` for one rank, ``mp`` for more.
DEFAULT_BACKEND = {True: "uni", False: "mp"}


def check_engine_config(config: Any, size: int) -> None:
    """Refuse engine options tensor parallelism does not shard."""
    if size <= 1 or config is None:
        return
    options = getattr(config, "plugin_options", {}) or {}
    for flag in ("speculative", "lora", "allow_runtime_lora"):
        if options.get(flag):
            raise ConfigError(f"--{flag.replace('_', '-')} is not supported with --tensor-parallel-size {size}")
    if getattr(config, "kv_cache_dtype", None) in ("fp8", "q8_0"):
        raise ConfigError(
            f"--kv-cache-dtype {config.kv_cache_dtype} is not supported with --tensor-parallel-size {size}"
        )


def load_parallel(
    model: str | Path | None,
    options: LoadOptions | None = None,
    registry: Any = None,
    *,
    size: int = 1,
    backend: str | None = None,
    threads: int | None = None,
    progress: bool = True,
    on_tensor: Any = None,
    timeout_s: float | None = None,
) -> LoadedModel:
    """Load ``model`` over ``size`` ranks placed by the executor ``backend``; rank 0's
    ``LoadedModel.model`` is a ``DriverModel`` (``model.close()`` / ``model.driver`` stop the job).
    ``timeout_s``: how long a collective of the running job waits for a rank (default
    ``DEFAULT_TIMEOUT_S``)."""
    from metrale_core.parallel.distributed import DEFAULT_TIMEOUT_S
    from metrale_core.plugin.discovery import load_registry

    options = options or LoadOptions()
    registry = registry if registry is not None else load_registry()
    backend = backend or DEFAULT_BACKEND[size == 1]
    if size < 1:
        raise ConfigError(f"--tensor-parallel-size must be >= 1, got {size}")
    spec = registry.get("executors", backend)
    executor = spec.factory()
    if size == 1 and backend == "uni":
        executor.launch(1)
        return load_model(model, options, registry, progress=progress, on_tensor=on_tensor)
    if timeout_s is not None and timeout_s <= 0:
        raise ConfigError(f"--distributed-timeout must be > 0, got {timeout_s}")
    path = resolve_model_path(model, progress=progress)
    spec = {
        "model": str(path),
        "dtype": options.dtype,
        "device": options.device,
        "weight_format": options.weight_format,
        "threads": threads,
        "timeout_s": timeout_s or DEFAULT_TIMEOUT_S,
    }
    driver = parallel_driver(executor, size, options.device, spec)
    try:
        tp = driver.tp
        status: str | None = None
        loaded = None
        error: BaseException | None = None
        try:
            loaded = load_model(
                path, evolve(options, tensor_parallel=tp), registry, progress=progress, on_tensor=on_tensor
            )
        except Exception as exc:
            status = f"rank 0: {type(exc).__name__}: {exc}"
            error = exc
        import torch.distributed as dist

        statuses: list[Any] = [None] * size
        dist.all_gather_object(statuses, (status, None), group=driver.setup)
        failures = [s for s, _ in statuses if s]
        driver.peers = {rank: where for rank, (_, where) in enumerate(statuses) if rank}
        if loaded is None:
            assert error is not None
            raise error
        if failures:
            raise ConfigError("tensor-parallel load failed: " + "; ".join(failures))
    except BaseException as exc:
        driver.fail(f"start failed: {exc}")  # the workers exit on their own; no stop message
        driver.close()
        raise
    from metrale_core.parallel.driver import DriverModel

    driver.start_heartbeat()
    logger.info(
        "tensor parallel: {} ranks through the {!r} executor ({}; collectives time out after {:g}s)",
        size,
        backend,
        ", ".join(f"rank {r}: {w}" for r, w in sorted(driver.peers.items())),
        driver.timeout_s,
    )
    return evolve(loaded, model=DriverModel(loaded.model, driver))


def parallel_driver(executor: Any, size: int, device: str, spec: dict[str, Any]) -> Any:
    """Start the workers, join the job as rank 0, send them ``spec`` (what to load, the timeout)
    and open the running job's groups; the ``Driver`` (its ``tp`` set), closed at exit."""
    import torch.distributed as dist

    from metrale_core.parallel.distributed import device_for, join, open_groups
    from metrale_core.parallel.driver import Driver

    os.environ["METRALE_TP_DEVICE"] = device  # the workers' device kind, inherited by them
    rdv = executor.launch(size)
    try:
        setup = join(rdv, device_for(device, 0))
        dist.broadcast_object_list([spec], src=0, group=setup)
        tp, control = open_groups(rdv, device_for(device, 0), spec["timeout_s"])
    except BaseException:
        executor.shutdown(0)
        raise
    driver = Driver(executor, control, size, tp, setup=setup, timeout_s=spec["timeout_s"])
    atexit.register(driver.close)
    return driver
