"""The loader factory of the Gemma 3 family: weight store + options -> model.

Owner: ``metrale_gemma3``; the factory registered in ``__init__.py`` is :func:`load_gemma3`.

Invariants: configs are read by ``config.py``, tensors by ``weights.py``, and the model built by
``model.py``; imports run one way (loader -> model -> weights -> config).  The weight format is
the shared linear layer's (``--weight-format``; every format is honoured).
"""

from __future__ import annotations

from typing import Any

from metrale_core.api import LoadOptions, resolve_weight_format, torch_dtype
from metrale_gemma3.config import Gemma3Dims
from metrale_gemma3.model import Gemma3LM
from metrale_gemma3.weights import load_weights

__all__ = ["load_gemma3"]


def load_gemma3(store: Any, options: LoadOptions) -> Gemma3LM:
    """Factory of the ``gemma3`` loader."""
    dims = Gemma3Dims.from_store(store)
    dtype = torch_dtype(options.dtype)
    weights = load_weights(
        store, dims, dtype, options.device, resolve_weight_format(options), tp=options.tensor_parallel
    )
    return Gemma3LM(dims, weights, dtype=dtype, device=options.device)
