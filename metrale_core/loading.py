"""From a path on disk to a ready model: weight store, loader plugin, model and tokenizer.

Owner: the CLI and the server call :func:`load_model` once at start-up; every other model (a
speculative draft model, an MTP layer) is built by the same :func:`model_from_store`.

Invariants:
- The loader is chosen by what the checkpoint declares (``model_type`` / ``architectures``)
  among the installed model-loader plugins; an unknown one is an ``UnknownArchitecture`` error
  listing what is installed.
- A requested weight format the chosen loader does not declare (``ModelLoaderSpec
  .weight_formats``) is a ``ConfigError`` before any weight is read, never silently ignored.
- A tensor-parallel group of more than one rank reaches only a loader whose spec declares
  ``tensor_parallel``; any other loader is a ``ConfigError`` saying why, before any weight is read.
- Progress is shown on stderr (one bar over the tensors read) and never on stdout.
- The built model gets a ``weight_store`` attribute (the open ``WeightStore``) unless it already
  has one, so engine-side plugins (FP8 KV scales) can read the checkpoint and its path.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import frozen
from loguru import logger

from metrale_core.components import LoadOptions, ModelLoaderSpec
from metrale_core.errors import ConfigError

if TYPE_CHECKING:
    from metrale_core.registry import Registry

__all__ = ["LoadedModel", "load_model", "model_from_store", "resolve_model_path"]


@frozen
class LoadedModel:
    """What :func:`load_model` returns."""

    model: Any
    store: Any
    tokenizer: Any
    loader_name: str
    path: Path


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
        from metrale_core.embedded import default_model_path

        return default_model_path(progress=progress)
    return Path(model).expanduser()


def model_from_store(
    store: Any, options: LoadOptions, registry: Registry, *, reading: Any = None
) -> tuple[ModelLoaderSpec, Any]:
    """The model of an open weight store through the loader ``registry`` picks for its config:
    the one loading function of every model (the target in :func:`load_model`, a speculative
    draft model or MTP layer through ``ProposerContext.load_model``).

    ``reading`` (a wrapper of ``store``, e.g. with a progress bar) is what the loader reads from;
    the model's ``weight_store`` is ``store``.  Returns the loader's spec and the model.
    """
    spec = registry.find_model_loader(store.config)
    wanted = options.weight_format
    if wanted is not None and wanted != "auto" and wanted not in spec.weight_formats:  # auto: every loader
        raise ConfigError(
            f"--weight-format {wanted} is not available for this checkpoint: its "
            f"loader {spec.name!r} honours {', '.join(spec.weight_formats)}"
        )
    tp = options.tensor_parallel
    if tp is not None and tp.world > 1 and not spec.tensor_parallel:
        why = f": {spec.tensor_parallel_note}" if spec.tensor_parallel_note else ""
        raise ConfigError(
            f"the {spec.name!r} loader does not support tensor parallelism "
            f"(--tensor-parallel-size {tp.world}){why}; use --tensor-parallel-size 1"
        )
    path = getattr(store, "path", None)
    logger.info(
        "loading {} with the '{}' loader ({} tensors)",
        path if path is not None else store,
        spec.name,
        len(store.names()),
    )
    model_obj = spec.factory(reading if reading is not None else store, options)
    drop_pages = getattr(store, "drop_resident_pages", None)
    if drop_pages is not None:  # GGUF: the repacked tensors are copies; the file's pages can go
        drop_pages()
    if getattr(model_obj, "weight_store", None) is None:
        model_obj.weight_store = store
    return spec, model_obj


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
    from metrale_core.plugins import load_registry
    from metrale_core.tokenizer import Tokenizer
    from metrale_core.weights import open_weights

    options = options or LoadOptions()
    registry = registry if registry is not None else load_registry()
    path = resolve_model_path(model, progress=progress)
    store = open_weights(path)
    if progress and sys.stderr.isatty():
        from tqdm import tqdm

        with tqdm(total=len(store.names()), desc="loading weights", unit="tensor", file=sys.stderr, leave=False) as bar:
            spec, model_obj = model_from_store(store, options, registry, reading=_ProgressStore(store, bar, on_tensor))
    elif on_tensor is not None:
        spec, model_obj = model_from_store(store, options, registry, reading=_ProgressStore(store, None, on_tensor))
    else:
        spec, model_obj = model_from_store(store, options, registry)
    tokenizer = Tokenizer.from_store(store)
    return LoadedModel(model=model_obj, store=store, tokenizer=tokenizer, loader_name=spec.name, path=path)
