"""Metrale model plugin: Qwen3 dense decoders and their Llama / Qwen2 relatives.

Owner: ``metrale_qwen3``.  Registers three model loaders through ``metrale_model_loaders``:
``qwen3`` (QK-norm before RoPE), ``llama`` (no QK-norm) and ``qwen2`` (q/k/v bias, no QK-norm),
all built by the same decoder (``model.DecoderLM``) from the shared layers of
``metrale_core.layers`` (norms, RoPE, SwiGLU, the linear layer and its weight formats, paged
attention), imported through ``metrale_core.api``.

Invariants: this package imports neither torch nor CuPy itself (factories are lazy, so
``met plugins`` stays fast); every factory has the signature ``factory(store, options) -> CausalLM``.
"""

from __future__ import annotations

from metrale_core import hookimpl
from metrale_core.api import ModelLoaderSpec, lazy_factory

__all__ = ["metrale_model_loaders"]

#: loader name -> (HF architecture, description); the factory is ``loader.load_<name>``.
_LOADERS = {
    "qwen3": ("Qwen3ForCausalLM", "Qwen3 dense decoder (QK-norm, GQA)"),
    "llama": ("LlamaForCausalLM", "Llama decoder (Llama 2 / 3, SmolLM2)"),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2 / Qwen2.5 decoder (q/k/v bias)"),
}


#: The ``--weight-format`` values the loaders honour (``metrale_core.layers.linear.WEIGHT_FORMATS``,
#: repeated here so that registering imports no torch; a test keeps the two equal).
WEIGHT_FORMATS = ("auto", "exact", "bf16", "int8", "int4")


@hookimpl
def metrale_model_loaders(register) -> None:
    """Register the qwen3, llama and qwen2 loaders."""
    for name, (architecture, description) in _LOADERS.items():
        register(
            ModelLoaderSpec(
                name=name,
                factory=lazy_factory(f"metrale_qwen3.loader:load_{name}"),
                model_types=(name,),
                architectures=(architecture,),
                description=description,
                weight_formats=WEIGHT_FORMATS,
                tensor_parallel=True,
            )
        )
