"""The KV-cache storage dtype: from ``--kv-cache-dtype`` to a storage layout and a codec.

Owner: ``LLMEngine`` calls :func:`resolve_kv_storage` once, before it sizes the KV pool; the
``ModelRunner`` allocates the pool with the result.

Invariants:
- ``kv_cache_dtype`` None keeps the model dtype; ``fp32`` / ``fp16`` / ``bf16`` are plain storage
  (the core's :class:`PlainKVCodec`); any other name (``fp8``) is served by a KV-scale source
  plugin, whose codec sets the storage dtype. Pool sizes use the storage dtype's bytes, so an FP8
  pool holds twice the tokens of a bf16 pool for the same ``kv_cache_memory``.
- Every registered KV-scale source's factory sees every request (so it can refuse its own
  options when its dtype is not selected); exactly one may return a codec for a plugin dtype.
- A plugin dtype with no plugin serving it is a ``ConfigError`` naming the plugin to install: the
  KV-scale sources declare the dtypes they serve (``KVScaleSourceSpec.kv_dtypes``); the core
  holds no plugin name.  The core's own ``q8_0`` is such a source (``plugin.builtins``).
- A codec with a ``storage_layout(layout)`` method lays out its own storage (q8_0 adds its
  scales, which pool sizing counts); otherwise the layout takes the codec's storage dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import torch
from attrs import frozen
from loguru import logger

from metrale_core.errors import ConfigError
from metrale_core.model_api import CausalLM, KVCodec, KVLayout, PlainKVCodec

if TYPE_CHECKING:
    from metrale_core.plugin.registry import Registry

__all__ = ["CORE_KV_DTYPES", "KVCodecRequest", "KVStorage", "resolve_kv_storage"]

#: Plain storage dtypes the core serves itself.
CORE_KV_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}


@frozen
class KVCodecRequest:
    """What a KV-scale source factory is told about the engine being built."""

    #: ``EngineConfig.kv_cache_dtype`` (None = the model dtype).
    kv_cache_dtype: str | None
    #: The model's attention KV layout, in the model dtype.
    layout: KVLayout
    #: The model's activation dtype.
    model_dtype: torch.dtype
    #: Device the pool lives on.
    device: torch.device
    #: Values of the flags plugins added (``EngineConfig.plugin_options``).
    options: Mapping[str, Any]
    #: The checkpoint's ``WeightStore`` (``model.weight_store``), or None when unknown.
    store: Any = None
    #: The checkpoint path (directory or file), or None when unknown.
    model_path: Path | None = None
    #: The model itself (plugins may read its attributes, e.g. its architecture).
    model: Any = None


@frozen
class KVStorage:
    """The pool's storage layout (storage dtype) and the codec that reads and writes it."""

    layout: KVLayout | None
    codec: KVCodec
    #: Name shown in logs: "fp8", "bf16", ... or the model dtype's name.
    name: str


def _dtype_name(dtype: torch.dtype) -> str:
    for name, value in CORE_KV_DTYPES.items():
        if value == dtype:
            return name
    return str(dtype).removeprefix("torch.")


def _plugin_codecs(request: KVCodecRequest, registry: Registry | None) -> list[tuple[str, KVCodec]]:
    found = []
    for name, spec in (registry.kv_scale_sources if registry is not None else {}).items():
        codec = spec.factory(request)
        if codec is not None:
            found.append((name, codec))
    return found


def _providers(wanted: str, registry: Registry | None) -> list[str]:
    """Distributions whose KV-scale sources declare ``wanted``: in ``registry``, else (the engine
    was built without one) among the installed plugins."""
    if registry is None:
        from metrale_core.plugin.discovery import load_registry

        try:
            registry = load_registry()
        except Exception:
            return []
    return sorted(
        {
            registry.provider("kv_scale_sources", name).distribution
            for name, spec in registry.kv_scale_sources.items()
            if wanted in spec.kv_dtypes
        }
    )


def resolve_kv_storage(
    config: Any, model: CausalLM, registry: Registry | None = None, device: torch.device | None = None
) -> KVStorage:
    """The storage layout and codec for ``model`` under ``config`` (see the module docstring)."""
    info = model.info
    wanted = config.kv_cache_dtype
    if info.kv is None or info.kv.num_layers == 0:
        if wanted is not None and wanted not in CORE_KV_DTYPES:
            logger.warning(
                "--kv-cache-dtype {} has no effect: {} keeps no attention KV cache", wanted, info.architecture
            )
        return KVStorage(info.kv, PlainKVCodec(), wanted or "none")
    store = getattr(model, "weight_store", None)
    path = getattr(store, "path", None)
    request = KVCodecRequest(
        kv_cache_dtype=wanted,
        layout=info.kv,
        model_dtype=info.dtype,
        device=torch.device(device) if device is not None else torch.device("cpu"),
        options=config.plugin_options,
        store=store,
        model_path=Path(path) if path is not None else None,
        model=model,
    )
    codecs = _plugin_codecs(request, registry)
    if wanted is None or wanted in CORE_KV_DTYPES:
        if codecs:
            raise ConfigError(
                f"KV-scale sources {[n for n, _ in codecs]} returned a codec for "
                f"kv_cache_dtype={wanted!r}, which the core stores itself"
            )
        dtype = info.kv.dtype if wanted is None else CORE_KV_DTYPES[wanted]
        return KVStorage(attrs.evolve(info.kv, dtype=dtype), PlainKVCodec(), _dtype_name(dtype))
    if not codecs:
        plugins = _providers(wanted, registry)
        installed = ", ".join(sorted(registry.kv_scale_sources)) if registry is not None else ""
        hint = (
            f"install the {' or '.join(plugins)} plugin and build the engine with its "
            f"registry (registry=load_registry())"
            if plugins
            else "install a plugin that provides it"
        )
        raise ConfigError(
            f"--kv-cache-dtype {wanted} is not available: {hint}; core KV dtypes: "
            f"{', '.join(CORE_KV_DTYPES)}; plugin KV-scale sources installed: {installed or 'none'}"
        )
    if len(codecs) > 1:
        raise ConfigError(
            f"--kv-cache-dtype {wanted} is served by several KV-scale sources "
            f"({', '.join(n for n, _ in codecs)}); disable all but one plugin"
        )
    name, codec = codecs[0]
    storage_layout = getattr(codec, "storage_layout", None)
    if storage_layout is not None:
        layout = storage_layout(info.kv)
    else:
        layout = attrs.evolve(info.kv, dtype=codec.storage_dtype if codec.storage_dtype is not None else info.kv.dtype)
    logger.info(
        "KV cache: {} storage ({} bytes/token) from the '{}' KV-scale source", wanted, layout.bytes_per_token(), name
    )
    return KVStorage(layout, codec, wanted)
