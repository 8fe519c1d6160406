"""The ``glm5_next`` loader factory: weight store + options -> :class:`~metrale_glm_kda.model.GlmKdaLM`.

Owner: ``metrale_glm_kda``; registered in ``__init__.py``.

Invariants: the config is read once (``GlmDims.from_config``) and every tensor through the store
with its expected shape; an unsupported dtype name is a ``ConfigError`` raised before loading.
The weight format (``--weight-format`` / ``$METRALE_WEIGHT_FORMAT``) is the shared linear layer's
(``weights.py`` builds every projection with ``build_linear``): ``exact``, ``bf16``, ``int8`` and
``int4`` are honoured; ``auto`` (the default) is ``exact`` here, the checkpoint's dense tensors in
the model dtype, as before the formats existed.  A format the layer cannot run (a quantized one
on a GPU) is the layer's ``ConfigError``, raised before any projection is built.
"""

from __future__ import annotations

from typing import Any

from metrale_core.api import LoadOptions, require_weight_format, torch_dtype
from metrale_glm_kda import WEIGHT_FORMATS

__all__ = ["load_glm5_next"]


def load_glm5_next(store: Any, options: LoadOptions):
    """Factory of the ``glm5_next`` loader."""
    from metrale_glm_kda.config import GlmDims
    from metrale_glm_kda.model import GlmKdaLM
    from metrale_glm_kda.weights import load_weights

    weight_format = require_weight_format(options, WEIGHT_FORMATS, "glm5_next")
    dims = GlmDims.from_config(store.config)
    dtype = torch_dtype(options.dtype)
    weights = load_weights(store, dims, dtype, options.device, weight_format)
    return GlmKdaLM(dims, weights, dtype=dtype, device=options.device)
