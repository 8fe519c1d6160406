"""The ``glm5_next`` loader factory: weight store + options -> :class:`~metrale_glm_kda.model.GlmKdaLM`.

Owner: ``metrale_glm_kda``; registered in ``__init__.py``.

Invariants: the config is read once (``GlmDims.from_config``) and every tensor through the store
with its expected shape; an unsupported dtype name, or a weight format other than ``exact``
(``--weight-format`` / ``$METRALE_WEIGHT_FORMAT``), is a ``ConfigError`` raised before loading.
"""

from __future__ import annotations

from typing import Any

from metrale_core.api import LoadOptions, require_weight_format, torch_dtype

__all__ = ["SUPPORTED_WEIGHT_FORMATS", "load_glm5_next"]

#: The weight formats this loader keeps (its projections are dense tensors; ``--weight-format``
#: asking for another is refused before any tensor is read).
SUPPORTED_WEIGHT_FORMATS = ("exact",)


def load_glm5_next(store: Any, options: LoadOptions):
    """Factory of the ``glm5_next`` loader."""
    from metrale_glm_kda.config import GlmDims
    from metrale_glm_kda.model import GlmKdaLM
    from metrale_glm_kda.weights import load_weights

    require_weight_format(options, SUPPORTED_WEIGHT_FORMATS, "glm5_next")
    dims = GlmDims.from_config(store.config)
    dtype = torch_dtype(options.dtype)
    weights = load_weights(store, dims, dtype, options.device)
    return GlmKdaLM(dims, weights, dtype=dtype, device=options.device)
