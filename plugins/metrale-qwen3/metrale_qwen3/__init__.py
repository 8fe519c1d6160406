"""Metrale model plugin: Qwen3 dense decoders and their Llama / Qwen2 relatives.

Owner: ``metrale_qwen3``.  Registers three model loaders through ``metrale_model_loaders``:
``qwen3`` (QK-norm before RoPE), ``llama`` (no QK-norm) and ``qwen2`` (q/k/v bias, no QK-norm),
each a decoder definition (``families.py``) that the core builds on ``metrale_core.layers``
(``metrale_core.api.DecoderSpec``: norms, RoPE, SwiGLU, the linear layer and its weight formats,
tensor parallelism, LoRA, paged attention).

Invariants: this package imports neither torch nor CuPy itself (a definition builds its model
only when its factory is called, so ``met plugins`` stays fast); every factory has the signature
``factory(store, options) -> CausalLM``.
"""

from __future__ import annotations

from metrale_core.api import registers
from metrale_qwen3.families import FAMILIES

__all__ = ["metrale_model_loaders"]


metrale_model_loaders = registers(*(family.loader_spec() for family in FAMILIES))
