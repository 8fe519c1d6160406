"""Build a decoder from its definition: weight store + load options -> :class:`DecoderLM`.

Owner: ``metrale_core.decoder``; ``DecoderSpec.load`` (every definition's loader factory) calls
:func:`build_decoder`.

Invariants: the config is read by ``dims``, tensors by ``weights``, the model built by ``model``;
imports run one way (build -> model -> rope / weights -> dims -> pattern -> spec -> names).  The weight format is
the shared linear layer's (``--weight-format``; every format is honoured);
``options.tensor_parallel`` (the rank's group, None without tensor parallelism) selects the
shard, and a family that cannot be sharded (``DecoderSpec.tensor_parallel_note``) refuses it.
"""

from __future__ import annotations

from typing import Any

from metrale_core.decoder.dims import DecoderDims
from metrale_core.decoder.model import DecoderLM
from metrale_core.decoder.spec import DecoderSpec
from metrale_core.decoder.weights import load_weights
from metrale_core.errors import ConfigError
from metrale_core.layers import resolve_weight_format, torch_dtype

__all__ = ["build_decoder"]


def build_decoder(spec: DecoderSpec, store: Any, options: Any) -> DecoderLM:
    """The model of family ``spec`` from ``store`` under ``options`` (a ``LoadOptions``)."""
    tp = options.tensor_parallel
    if tp is not None and tp.enabled and spec.tensor_parallel_note:
        raise ConfigError(spec.tensor_parallel_note)
    dims = DecoderDims.from_config(store.config, spec, gguf=getattr(store, "format", None) == "gguf")
    dtype = torch_dtype(options.dtype)
    weights = load_weights(spec, store, dims, dtype, options.device, resolve_weight_format(options), tp=tp)
    return DecoderLM(spec, dims, weights, dtype=dtype, device=options.device)
