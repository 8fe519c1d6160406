"""From a path on disk to a ready model: weight store, loader plugin, model and tokenizer.

Owner: the CLI and the server call :func:`load_model` once at start-up; every other model (a
speculative draft model, an MTP layer) is built by the same ``model_build.model_from_store``
(re-exported here), which the engine may import; this module sits above the engine.

Invariants:
- Progress is shown on stderr (one bar over the tensors read) and never on stdout.
- What ``model_from_store`` guarantees (loader choice, format and tensor-parallel checks, the
  ``weight_store`` attribute) holds for the model :func:`load_model` returns.
- The GGUF projections of the model :func:`load_model` builds share one activation precision,
  chosen once before it returns (``metrale_core.loading.activation_probe``; not under tensor parallelism of
  more than one rank, which keeps 15-bit).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attrs import frozen

from metrale_core.layers.formats.gguf_linear import activation_precision_scope
from metrale_core.loading.model_build import model_from_store
from metrale_core.plugin.components import LoadOptions

__all__ = ["LoadedModel", "load_model", "model_from_store", "resolve_model_path"]


@frozen
class LoadedModel:
    """What :func:`load_model` returns."""

    model: Any
    store: Any
    tokenizer: Any
    loader_name: str
    path: Path
    #: The GGUF projections' shared activation precision and how it was chosen (None: the model
    #: has no GGUF projection).
    activation_precision: Any = None
    activation_probe: Any = None


class _ProgressStore:
    """Wraps a weight store; each tensor read advances a progress bar and/or calls ``on_tensor``."""

    def __init__(self, store, bar, on_tensor=None):
        self._store = store
        self._bar = bar
        self._on_tensor = on_tensor
        self._done, self._total = 0, len(store.names())
        self._seen: set[str] = set()

    def get(self, name, *args, **kwargs):
        tensor = self._store.get(name, *args, **kwargs)
        self._count(name, tensor.numel() * tensor.element_size())
        return tensor

    def get_raw(self, name, *args, **kwargs):
        raw = self._store.get_raw(name, *args, **kwargs)
        data = raw.data
        self._count(name, int(data.nbytes) if hasattr(data, "nbytes") else data.numel() * data.element_size())
        return raw

    def _count(self, name, nbytes) -> None:
        """Each stored tensor counts once, whether read dense (``get``) or as blocks (``get_raw``)."""
        if name in self._seen:
            return
        self._seen.add(name)
        self._done += 1
        if self._bar is not None:
            self._bar.update(1)
        if self._on_tensor is not None:
            self._on_tensor(self._done, self._total, nbytes)

    def __contains__(self, name) -> bool:
        return name in self._store

    def __getattr__(self, attr):
        return getattr(self._store, attr)


def resolve_model_path(model: str | Path | None, *, progress: bool = True) -> Path:
    """The checkpoint path to load: ``model`` if given, else the embedded default model."""
    if model is None:
        from metrale_core.loading.embedded import default_model_path

        return default_model_path(progress=progress)
    return Path(model).expanduser()


def load_model(
    model: str | Path | None,
    options: LoadOptions | None = None,
    registry=None,
    *,
    progress: bool = True,
    on_tensor: Callable[[int, int, int], None] | None = None,
) -> LoadedModel:
    """Open the checkpoint, pick its loader plugin, build the model and its tokenizer.

    ``on_tensor(done, total, nbytes)`` (optional) is called after each tensor is read, with the
    tensors read so far, the tensors in the checkpoint and the bytes of the tensor just read.
    """
    from metrale_core.plugin.discovery import load_registry
    from metrale_core.text.tokenizer import Tokenizer
    from metrale_core.weights import open_weights

    options = options or LoadOptions()
    registry = registry if registry is not None else load_registry()
    path = resolve_model_path(model, progress=progress)
    store = open_weights(path)
    with activation_precision_scope() as precision:
        if progress and sys.stderr.isatty():
            from tqdm import tqdm

            with tqdm(
                total=len(store.names()), desc="loading weights", unit="tensor", file=sys.stderr, leave=False
            ) as bar:
                reading = _ProgressStore(store, bar, on_tensor)
                spec, model_obj = model_from_store(store, options, registry, reading=reading)
        elif on_tensor is not None:
            spec, model_obj = model_from_store(store, options, registry, reading=_ProgressStore(store, None, on_tensor))
        else:
            spec, model_obj = model_from_store(store, options, registry)
    tokenizer = Tokenizer.from_store(store)
    probe = None
    tp = options.tensor_parallel
    if precision.members and (tp is None or tp.world == 1):
        from metrale_core.loading.activation_probe import choose_activation_precision

        probe = choose_activation_precision(
            model_obj, tokenizer, precision, source=path if path.is_file() else None, native=precision.native
        )
    return LoadedModel(
        model=model_obj,
        store=store,
        tokenizer=tokenizer,
        loader_name=spec.name,
        path=path,
        activation_precision=precision if precision.members else None,
        activation_probe=probe,
    )
