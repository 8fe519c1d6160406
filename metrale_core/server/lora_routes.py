"""``POST /v1/load_lora_adapter`` and ``POST /v1/unload_lora_adapter`` (vLLM's shapes).

Owner: the server; the engine's ``AdapterBank`` (``metrale_core.engine.adapters``) does the work.

Invariants:
- Both answer 404 unless the engine has a bank with runtime loading allowed
  (``--allow-runtime-lora``); the API key applies (they sit on the guarded router).
- A bad adapter (missing files, a pickled ``.bin``, rank above ``--max-lora-rank``, shapes that do
  not match the base) is a 400 whose message names the file; nothing changes and the server
  keeps serving.  Loading runs off the event loop, on a thread of its own that ends with it (it
  runs torch ops; a pooled thread would keep an OpenMP team and slow the engine, see
  ``server.offload``).
- Unloading an adapter in use lets its running requests finish on it; new requests naming it
  get 404.
"""

from __future__ import annotations

import functools
from typing import Any

from litestar.di import NamedDependency

from metrale_core.engine.adapter_key import adapter_of
from metrale_core.errors import ConfigError
from metrale_core.server.common import lora_bank
from metrale_core.server.decode import Body
from metrale_core.server.deps import body_post
from metrale_core.server.errors import APIError
from metrale_core.server.offload import in_own_thread

__all__ = ["LoadLoRARequest", "UnloadLoRARequest", "load_lora_adapter", "unload_lora_adapter"]


class LoadLoRARequest(Body, frozen=True):
    lora_name: str
    lora_path: str


class UnloadLoRARequest(Body, frozen=True):
    lora_name: str


def _runtime_bank(host: Any) -> Any:
    host.ready()
    if host.replicated:
        raise APIError(
            400,
            "loading LoRA adapters at run time is not supported with "
            "--data-parallel-size > 1 (the replicas load theirs at start: --lora)",
        )
    bank = lora_bank(host)
    if bank is None or not bank.allow_runtime:
        raise APIError(
            404,
            "loading LoRA adapters at run time is off; start the server with --allow-runtime-lora",
            code="not_found",
            type="invalid_request_error",
        )
    return bank


@body_post("/v1/load_lora_adapter", LoadLoRARequest, tag="lora", ok="LoRAStatus")
async def load_lora_adapter(host: NamedDependency[Any], req: NamedDependency[LoadLoRARequest]) -> dict[str, Any]:
    """Load a PEFT LoRA adapter as a new model name."""
    bank = _runtime_bank(host)
    name = req.lora_name.strip()
    if not name or name == host.config.served_model_name:
        raise APIError(
            400,
            f"lora_name {req.lora_name!r} must be a non-empty name other than the served model's",
            param="lora_name",
        )
    if bank.key_for(name) is not None:
        raise APIError(400, f"a LoRA adapter named {name!r} is already loaded", param="lora_name")
    try:
        await in_own_thread(functools.partial(bank.load, name, req.lora_path), name="metrale-lora-load")
    except ConfigError as exc:
        raise APIError(400, str(exc), param="lora_path") from None
    return {"status": "ok", "lora_name": name, "message": f"LoRA adapter {name!r} added"}


@body_post("/v1/unload_lora_adapter", UnloadLoRARequest, tag="lora", ok="LoRAStatus")
async def unload_lora_adapter(host: NamedDependency[Any], req: NamedDependency[UnloadLoRARequest]) -> dict[str, Any]:
    """Unload a LoRA adapter by name."""
    bank = _runtime_bank(host)
    engine = host.served.engine
    in_use = {adapter_of(s) for s in list(engine.scheduler.seqs.values())} - {None}
    try:
        bank.unregister(req.lora_name, in_use)
    except KeyError:
        raise APIError(
            404, f"no LoRA adapter named {req.lora_name!r} is loaded", param="lora_name", code="model_not_found"
        ) from None
    return {"status": "ok", "lora_name": req.lora_name, "message": f"LoRA adapter {req.lora_name!r} removed"}
