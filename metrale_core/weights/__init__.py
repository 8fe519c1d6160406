"""Checkpoint access: ``open_weights(path)`` -> a :class:`WeightStore` with HF tensor names.

Owner: ``metrale_core.weights``.  Formats: Hugging Face directories (config.json + safetensors,
single or sharded) and GGUF files (F32/F16/BF16/Q8_0/Q4_0/Q4_1 natively, other GGML types through
``gguf.quants``).  Nothing is ever unpickled.
"""

from metrale_core.weights.expert_slices import ExpertSlices
from metrale_core.weights.gguf_dequant import NATIVE_TYPES, dequantize
from metrale_core.weights.gguf_store import GGUFStore
from metrale_core.weights.opener import open_weights
from metrale_core.weights.safetensors_store import SafetensorsStore
from metrale_core.weights.store import RawTensor, WeightStore, normalise_config

__all__ = [
    "NATIVE_TYPES",
    "ExpertSlices",
    "GGUFStore",
    "RawTensor",
    "SafetensorsStore",
    "WeightStore",
    "dequantize",
    "normalise_config",
    "open_weights",
]
