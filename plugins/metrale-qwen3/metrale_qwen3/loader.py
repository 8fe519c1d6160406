"""The loader factories of the Llama / Qwen2 / Qwen3 family: weight store + options -> model.

Owner: ``metrale_qwen3``; the factories registered in ``__init__.py`` call :func:`load_model`.

Invariants: configs are read by ``dims.py``, tensors by ``weights.py``, and the model built by
``model.py``; imports run one way (loader -> model -> weights -> dims), with no cycle.  The
weight format is the shared linear layer's (``--weight-format``; every format is honoured);
``options.tensor_parallel`` (the rank's group, None without tensor parallelism) selects the shard.
"""

from __future__ import annotations

from typing import Any

from metrale_core.api import LoadOptions, resolve_weight_format, torch_dtype
from metrale_qwen3.dims import VARIANTS, ArchVariant, ModelDims
from metrale_qwen3.model import DecoderLM
from metrale_qwen3.weights import load_weights

__all__ = ["load_llama", "load_model", "load_qwen2", "load_qwen3"]


def load_model(store: Any, options: LoadOptions, variant: ArchVariant) -> DecoderLM:
    """Build a :class:`~metrale_qwen3.model.DecoderLM` from ``store`` (the loader factories)."""
    dims = ModelDims.from_config(store.config, variant)
    dtype = torch_dtype(options.dtype)
    weights = load_weights(
        store, dims, dtype, options.device, resolve_weight_format(options), tp=options.tensor_parallel
    )
    return DecoderLM(dims, weights, architecture=variant.name, dtype=dtype, device=options.device)


def load_qwen3(store: Any, options: LoadOptions) -> DecoderLM:
    """Factory of the ``qwen3`` loader."""
    return load_model(store, options, VARIANTS["qwen3"])


def load_llama(store: Any, options: LoadOptions) -> DecoderLM:
    """Factory of the ``llama`` loader."""
    return load_model(store, options, VARIANTS["llama"])


def load_qwen2(store: Any, options: LoadOptions) -> DecoderLM:
    """Factory of the ``qwen2`` loader."""
    return load_model(store, options, VARIANTS["qwen2"])
