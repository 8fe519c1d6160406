"""Building one model from an open weight store through the loader plugin its config names.

Owner: ``metrale_core.loading.load.load_model`` (the served model) and the engine's
``ProposerContext.load_model`` (draft models, MTP layers) call :func:`model_from_store`: the one
loading function of every model.  It sits below the engine, which imports it; ``loading`` (which
also calibrates the loaded model with the engine) sits above.

Invariants:
- The loader is chosen by what the checkpoint declares (``model_type`` / ``architectures``)
  among the installed model-loader plugins; an unknown one is one ``UnknownArchitecture`` line
  (a ``ConfigError``) listing what is supported: for a GGUF store (``WeightStore
  .gguf_architectures``) the GGUF architectures an installed loader serves, else the HF
  ``architectures`` and ``model_type`` values.
- A requested weight format the chosen loader does not declare (``ModelLoaderSpec
  .weight_formats``) is a ``ConfigError`` before any weight is read, never silently ignored.
- A tensor-parallel group of more than one rank reaches only a loader whose spec declares
  ``tensor_parallel``; any other loader is a ``ConfigError`` saying why, before any weight is read.
- The built model gets a ``weight_store`` attribute (the open ``WeightStore``) unless it already
  has one, so engine-side plugins (FP8 KV scales) can read the checkpoint and its path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loguru import logger

from metrale_core.errors import ConfigError
from metrale_core.plugin.components import LoadOptions, ModelLoaderSpec

if TYPE_CHECKING:
    from metrale_core.plugin.registry import Registry

__all__ = ["model_from_store"]


def model_from_store(
    store: Any, options: LoadOptions, registry: Registry, *, reading: Any = None
) -> tuple[ModelLoaderSpec, Any]:
    """The model of an open weight store through the loader ``registry`` picks for its config:
    the one loading function of every model (the target in :func:`load_model`, a speculative
    draft model or MTP layer through ``ProposerContext.load_model``).

    ``reading`` (a wrapper of ``store``, e.g. with a progress bar) is what the loader reads from;
    the model's ``weight_store`` is ``store``.  Returns the loader's spec and the model.
    """
    spec = registry.find_model_loader(store.config, gguf_architectures=getattr(store, "gguf_architectures", None))
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
