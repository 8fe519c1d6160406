"""Metrale model plugin: Gemma 3 text decoders.

Owner: ``metrale_gemma3``.  Registers one model loader through ``metrale_model_loaders`` for HF
checkpoints (``model_type`` ``gemma3_text``, and ``gemma3`` with a ``text_config``) and GGUF files
(``general.architecture`` ``gemma3``), built by ``model.Gemma3LM`` from the shared layers of
``metrale_core.layers`` (the ``(1 + w)`` RMSNorm, QK-norm + RoPE, GeGLU, the linear layer and its
weight formats, paged attention and its sliding-window form), imported through
``metrale_core.api``.

Invariants: this package imports neither torch nor CuPy itself (the factory is lazy, so
``met plugins`` stays fast); the factory has the signature ``factory(store, options) -> CausalLM``.
"""

from __future__ import annotations

from metrale_core import hookimpl
from metrale_core.api import ModelLoaderSpec, lazy_factory

__all__ = ["WEIGHT_FORMATS", "metrale_model_loaders"]

#: The ``--weight-format`` values the loader honours (the shared linear layer's; a test keeps the
#: two equal).
WEIGHT_FORMATS = ("exact", "bf16", "int8", "int4")


@hookimpl
def metrale_model_loaders(register) -> None:
    """Register the gemma3 loader."""
    register(
        ModelLoaderSpec(
            name="gemma3",
            factory=lazy_factory("metrale_gemma3.loader:load_gemma3"),
            model_types=("gemma3_text", "gemma3"),
            architectures=("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"),
            description="Gemma 3 text decoder (sliding-window + global attention, GeGLU, QK-norm)",
            weight_formats=WEIGHT_FORMATS,
            tensor_parallel=True,
        )
    )
