"""The ``glm5_next`` loader factory: weight store + options -> :class:`~metrale_glm_kda.model.GlmKdaLM`.

Owner: ``metrale_glm_kda``; registered in ``__init__.py``.

Invariants: the config is read once (``GlmDims.from_config``) and every tensor through the store
with its expected shape; an unsupported dtype name is a ``ConfigError``.
"""

from __future__ import annotations

from typing import Any

import torch

from metrale_core.components import LoadOptions
from metrale_core.errors import ConfigError

__all__ = ["load_glm5_next", "torch_dtype"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise ConfigError(f"dtype {name!r} is not supported; use one of {sorted(_DTYPES)}") from None


def load_glm5_next(store: Any, options: LoadOptions):
    """Factory of the ``glm5_next`` loader."""
    from metrale_glm_kda.config import GlmDims
    from metrale_glm_kda.model import GlmKdaLM
    from metrale_glm_kda.weights import load_weights

    dims = GlmDims.from_config(store.config)
    dtype = torch_dtype(options.dtype)
    weights = load_weights(store, dims, dtype, options.device)
    return GlmKdaLM(dims, weights, dtype=dtype, device=options.device)
