"""The public API of Metrale for plugin authors: everything a plugin needs, from one module.

Owner: ``metrale_core.api``.  Plugins and contrib packages import from here (and ``hookimpl`` /
``__version__`` from ``metrale_core``), never from the implementation modules, which may move:
``from metrale_core.api import ModelLoaderSpec, CustomOp, build_linear``.  The import-linter
contracts in ``pyproject.toml`` (run by ``tests/test_import_contracts.py``) enforce it.  The
plugin guide (``docs/plugin-guide.md``) lists the names by topic and tier.

:data:`FACE` is the one declaration of the public face: per tier, the modules that define public
names, and per module either its names or :data:`ALL` (every name of the module's own
``__all__``, so such a name is declared only there).  The rest is derived from it by
``python -m metrale_core.plugin.public_face``, which writes

- ``metrale_core/_api_index.py``: :data:`PUBLIC` (name -> defining module) and :data:`TIER`
  (name -> tier), the table this module resolves names from at run time without importing them;
- ``metrale_core/api.pyi``: the static view (``from <module> import <name> as <name>`` per name),
  so mypy and IDEs see the real types while run time stays lazy.

``tests/plugin/test_public_face.py`` fails when either file is stale and names that command.

Tiers:

- ``author``: what a plugin author needs: registration and errors, the model contract, decoder
  definitions, weights, layers (with LoRA targets, MoE routing, tensor parallelism), kernels,
  sampling and stream parsing.  A model plugin uses this tier only (a test checks the in-tree
  model plugins).
- ``expert``: engine internals for plugins that work inside the engine (schedulers, speculative
  proposers, LoRA adapters, executors): scheduling protocols, requests and sequences, the block
  manager and runner, speculation records, the LoRA wrapper, executor start-up.  These follow the
  engine more closely and change more often.

Invariants:
- Importing this module imports nothing but the generated index (no torch): each name is resolved
  on first access through :data:`PUBLIC` (PEP 562 ``__getattr__``) and cached in the module, so a
  plugin's ``__init__`` that only needs specs and ``hookimpl`` stays as light as those modules are.
- A name is in exactly one tier; every name in :data:`PUBLIC` resolves (``tests/test_public_api.py``
  imports each one); a name leaves the face only with a minor version bump (plugins pin
  ``metrale-core>=0.1,<0.2``).
"""

from __future__ import annotations

import importlib
from typing import Any

from metrale_core._api_index import PUBLIC, TIER

#: In :data:`FACE`, "every name of the module's ``__all__``".
ALL = "__all__"

#: tier -> module -> its public names (or :data:`ALL`): the one place a public name is declared.
FACE: dict[str, dict[str, tuple[str, ...] | str]] = {
    "author": {
        # registration and errors
        "metrale_core": ALL,
        "metrale_core.plugin.components": ALL,
        "metrale_core.plugin.discovery": ("LazyFactory", "lazy_factory", "load_registry"),
        "metrale_core.plugin.registering": ALL,
        # the types of the engine flags a plugin adds (metrale_engine_flags)
        "metrale_core.cli.flags": ("number_type",),
        "metrale_core.errors": (
            "ConfigError",
            "CorruptWeightsFile",
            "InvalidRequest",
            "KVCacheExhausted",
            "MetraleError",
            "MissingWeightsFile",
            "PluginError",
            "ShapeMismatch",
            "WeightsError",
        ),
        # the model contract, decoder definitions, weights and layers
        "metrale_core.model_api": (
            "CausalLM",
            "ForwardBatch",
            "KVCodec",
            "KVLayout",
            "ModelInfo",
            "PagedKVCache",
            "PlainKVCodec",
            "RecurrentLayout",
            "StepSplit",
            "gather_blocks",
        ),
        "metrale_core.decoder": ALL,
        "metrale_core.decoder.model": ALL,
        "metrale_core.weights": ("RawTensor", "WeightStore", "open_weights"),
        "metrale_core.weights.gguf_tensors": ALL,
        "metrale_core.weights.gguf_hf": ("unpermute_rows",),
        "metrale_core.layers": ALL,
        "metrale_core.layers.lowrank.lora_targets": (
            "LoRAPart",
            "LoRATarget",
            "LoRATargets",
            "LoRATargetsLM",
        ),
        "metrale_core.layers.blocks.moe": ("Groups", "route"),
        "metrale_core.layers.parallel": ALL,
        # kernels
        "metrale_core.kernels": ALL,
        "metrale_core.kernels.checks": ("check_paged_kv",),
        "metrale_core.kernels.paged_decode": ALL,
        "metrale_core.kernels.cpu": ("cpu_flags",),
        "metrale_core.kernels.cuda": (
            "f32",
            "i32",
            "i64",
            "ptr",
            "torch_stream",
        ),
        # sampling
        "metrale_core.sampling.position": ALL,
        "metrale_core.sampling.interface": ALL,
        "metrale_core.sampling.params": ALL,
        "metrale_core.sampling.sampler": ("inverse_cdf",),
        "metrale_core.sampling.structured": ("StructuredOutput", "StructuredOutputError"),
        # stream parsing
        "metrale_core.streamparse.base": ALL,
    },
    "expert": {
        # registration and errors
        "metrale_core.loading.model_build": ALL,
        # engine internals: scheduling, requests, speculation, adapters, executors
        "metrale_core.engine.speculation": (
            "Draft",
            "ProposerContext",
            "Speculator",
            "StepReport",
            "VerifyRow",
        ),
        "metrale_core.engine.runner": ("ModelRunner", "model_device"),
        "metrale_core.engine.adapters": ("ADAPTER_EXTRA", "AdapterBank", "AdapterWeights"),
        "metrale_core.layers.lowrank.lora": (
            "LoRALinear",
            "LoRARows",
            "active_rows",
            "attach_lora",
        ),
        "metrale_core.engine.block_manager": ("BlockManager",),
        "metrale_core.engine.side_pool": ALL,
        "metrale_core.engine.policy": ("AdmissionStep", "FcfsPolicy", "SchedulingPolicy"),
        "metrale_core.engine.plan": ALL,
        "metrale_core.engine.request": ("Request", "Sequence", "SequenceStatus"),
        "metrale_core.parallel.distributed": ("Rendezvous",),
        "metrale_core.parallel.executors": ("free_port",),
        "metrale_core.parallel.worker": ("run_worker",),
    },
}

TIERS = tuple(FACE)

__all__ = ["ALL", "FACE", "PUBLIC", "TIER", "TIERS", "names", *sorted(PUBLIC)]


def names(tier: str) -> list[str]:
    """The public names of ``tier`` (``"author"`` or ``"expert"``), sorted."""
    if tier not in FACE:
        raise ValueError(f"unknown tier {tier!r}; tiers are {TIERS}")
    return sorted(name for name, t in TIER.items() if t == tier)


def __getattr__(name: str) -> Any:
    module = PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"metrale_core.api has no public name {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(PUBLIC))
