"""``AdapterBank``: the LoRA adapters one engine serves, their device slots (LRU) and the step map.

Owner: the engine side of multi-LoRA.  A feature plugin (``metrale-lora``) parses adapter files
into :class:`AdapterWeights`, wraps the model's projections (``metrale_core.layers.lowrank.lora``) and
hangs a bank on ``engine.runner.lora`` (``metrale_lora.engine_setup.enable_adapters``); the server
resolves a request's ``model`` to an adapter key (:meth:`AdapterBank.key_for`) and hands it to
the engine in the sequence's extras (:data:`ADAPTER_EXTRA`); the runner runs each forward inside
:meth:`AdapterBank.scope` (the step's row -> slot map, visible to the wrappers).  The bank knows
the wrappers only by duck type (``set_slot``, ``clear_slot``, parts with ``in_features`` /
``out_features``), so the engine does not import the layers.

Invariants:
- A sequence's adapter is ``seq.extras[ADAPTER_EXTRA]``, the key of one registered adapter
  (``name@serial``: a name loaded again after an unload gets a new key, so the prefix cache,
  whose block keys start from the adapter key, never mixes the two); absent = the base model.
- At most ``max_loras`` adapters are resident (written into the wrappers' slots); a step never
  uses more (the scheduler admits no sequence that would need another, see
  ``Scheduler.max_adapters``); beyond that the least recently used resident one not in the step
  is evicted and re-written from host memory when needed again.
- Registration checks everything that can be wrong before anything changes: every target module
  exists in the model with the right ``in``/``out`` sizes, the rank is at most ``max_rank``; the
  error names the adapter's file.
- The bank is shared by the engine thread (``rows_for``) and the server (register/unregister):
  one lock guards it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

import torch
from attrs import field, frozen

from metrale_core.engine.adapter_key import ADAPTER_EXTRA, adapter_of
from metrale_core.errors import ConfigError

__all__ = ["ADAPTER_EXTRA", "AdapterBank", "AdapterWeights", "adapter_of"]


def _as_dict(
    modules: Mapping[str, tuple[torch.Tensor, torch.Tensor, float]],
) -> dict[str, tuple[torch.Tensor, torch.Tensor, float]]:
    return dict(modules)


@frozen
class AdapterWeights:
    """A parsed adapter: module -> ``(A [r, in], B [out, r], scale)`` in float32 on the host."""

    #: The file (or directory) it came from, named in errors.
    source: str
    modules: dict[str, tuple[torch.Tensor, torch.Tensor, float]] = field(converter=_as_dict)

    @property
    def rank(self) -> int:
        return max((int(a.shape[0]) for a, _, _ in self.modules.values()), default=0)


class AdapterBank:
    """Registered adapters and the slots of the model's :class:`LoRALinear` wrappers."""

    def __init__(
        self,
        targets: dict[str, tuple[Any, Any]],
        max_loras: int,
        max_rank: int,
        row_scope: Callable[[list[int] | None], AbstractContextManager],
        loader: Callable[[str], AdapterWeights] | None = None,
    ) -> None:
        if max_loras < 1 or max_rank < 1:
            raise ConfigError(f"--max-loras and --max-lora-rank must be at least 1 (got {max_loras}, {max_rank})")
        self.targets = targets
        self.max_loras = max_loras
        self.max_rank = max_rank
        #: Per-row slots (None: no adapter row) -> the context the forward runs in
        #: (``metrale_core.layers.lowrank.lora.active_rows`` over ``LoRARows.from_slots``).
        self.row_scope = row_scope
        #: Path -> weights (the plugin's parser); used by :meth:`load`.
        self.loader = loader
        #: Whether the server may load / unload adapters at run time (``--allow-runtime-lora``).
        self.allow_runtime = False
        self._lock = threading.Lock()
        self._serial = 0
        self._names: dict[str, str] = {}  # name -> key
        self._weights: dict[str, AdapterWeights] = {}  # key -> weights (host)
        self._resident: OrderedDict[str, int] = OrderedDict()  # key -> slot, LRU first
        self._wrappers = list({id(w): w for w, _ in targets.values()}.values())
        #: Times an adapter was written into a slot (first loads and reloads after eviction).
        self.num_slot_writes = 0

    # --- registry (server side) ---------------------------------------------------------------
    def names(self) -> list[str]:
        with self._lock:
            return list(self._names)

    def key_for(self, name: str) -> str | None:
        """The key of the adapter registered as ``name`` (None when there is none)."""
        with self._lock:
            return self._names.get(name)

    def check(self, weights: AdapterWeights) -> None:
        """Raise ``ConfigError`` naming ``weights.source`` unless the model can take the adapter."""
        if not weights.modules:
            raise ConfigError(f"LoRA adapter {weights.source}: it targets no module")
        for module, (a, b, _) in weights.modules.items():
            target = self.targets.get(module)
            if target is None:
                raise ConfigError(
                    f"LoRA adapter {weights.source}: module {module!r} is not a "
                    f"projection of the base model (known e.g. "
                    f"{sorted(self.targets)[:3]})"
                )
            part = target[1]
            r = int(a.shape[0])
            if r > self.max_rank:
                raise ConfigError(
                    f"LoRA adapter {weights.source}: rank {r} of {module!r} is above --max-lora-rank {self.max_rank}"
                )
            if tuple(a.shape) != (r, part.in_features) or tuple(b.shape) != (part.out_features, r):
                raise ConfigError(
                    f"LoRA adapter {weights.source}: {module!r} has lora_A "
                    f"{list(a.shape)} and lora_B {list(b.shape)} but the base "
                    f"projection is [{part.out_features}, {part.in_features}] "
                    f"(shape mismatch with the base model)"
                )

    def register(self, name: str, weights: AdapterWeights) -> str:
        """Add ``weights`` as ``name``; returns its key.  A name already in use is an error."""
        self.check(weights)
        with self._lock:
            if name in self._names:
                raise ConfigError(f"a LoRA adapter named {name!r} is already loaded")
            self._serial += 1
            key = f"{name}@{self._serial}"
            self._names[name] = key
            self._weights[key] = weights
            return key

    def load(self, name: str, path: str) -> str:
        """Parse ``path`` with the plugin's loader and :meth:`register` it."""
        if self.loader is None:
            raise ConfigError("no LoRA adapter loader is installed (install metrale-lora)")
        return self.register(name, self.loader(path))

    def unregister(self, name: str, in_use: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        """Forget ``name``; its weights stay while a sequence in ``in_use`` (keys) still runs
        with it and are dropped at the next unregister after that."""
        with self._lock:
            key = self._names.pop(name, None)
            if key is None:
                raise KeyError(name)
            live = set(self._names.values()) | set(in_use)
            for k in [k for k in self._weights if k not in live]:
                del self._weights[k]
                slot = self._resident.pop(k, None)
                if slot is not None:
                    for w in self._wrappers:
                        w.clear_slot(slot)

    # --- engine side ------------------------------------------------------------------------
    def resident(self) -> list[str]:
        with self._lock:
            return list(self._resident)

    def _slot(self, key: str, pinned: set[str]) -> int:
        slot = self._resident.get(key)
        if slot is not None:
            self._resident.move_to_end(key)
            return slot
        weights = self._weights.get(key)
        if weights is None:
            raise ConfigError(f"LoRA adapter {key.rsplit('@', 1)[0]!r} is not loaded")
        if len(self._resident) < self.max_loras:
            used = set(self._resident.values())
            slot = next(s for s in range(self.max_loras) if s not in used)
        else:
            victim = next((k for k in self._resident if k not in pinned), None)
            if victim is None:
                raise RuntimeError(f"a step needs more than --max-loras {self.max_loras} adapters")
            slot = self._resident.pop(victim)
        for w in self._wrappers:
            w.set_slot(slot, weights.modules)
        self._resident[key] = slot
        self.num_slot_writes += 1
        return slot

    def scope(self, plan: Any) -> AbstractContextManager:
        """The context ``plan``'s forward runs in (the runner enters it around the model call)."""
        return self.row_scope(self.rows_for(plan))

    def rows_for(self, plan: Any) -> list[int] | None:
        """The slot of each row of ``plan`` (rows in chunk order, -1 = base), making its adapters
        resident; None when no row uses an adapter."""
        keys = [adapter_of(chunk.seq) for chunk in plan.chunks]
        if not any(keys):
            return None
        with self._lock:
            pinned = {k for k in keys if k}
            slots: list[int] = []
            for chunk, key in zip(plan.chunks, keys, strict=True):
                slot = -1 if key is None else self._slot(key, pinned)
                slots.extend([slot] * chunk.num_tokens)
        return slots
