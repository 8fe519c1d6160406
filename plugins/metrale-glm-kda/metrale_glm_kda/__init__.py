"""Metrale model plugin: GLM-5.3-Flash (``glm5_next``), a KDA / DSA hybrid with mHC and MoE.

Owner: ``metrale_glm_kda``.  Registers the ``glm5_next`` model loader through
``metrale_model_loaders`` (text input only); the model is ``model.GlmKdaLM``.

Invariants: this package imports neither torch nor CuPy itself (the factory is lazy, so
``met plugins`` stays fast); the factory has the signature ``factory(store, options) -> CausalLM``.
"""

from __future__ import annotations

from metrale_core.api import ModelLoaderSpec, lazy_factory, registers

__all__ = ["WEIGHT_FORMATS", "metrale_model_loaders"]

#: The ``--weight-format`` values the loader honours: the shared linear layer's (``auto`` loads
#: ``exact``); a test keeps them inside ``metrale_core.layers.WEIGHT_FORMATS``.
WEIGHT_FORMATS = ("exact", "bf16", "int8", "int4")


#: The ``metrale_model_loaders`` hook.  Register the glm5_next loader.
metrale_model_loaders = registers(
    ModelLoaderSpec(
        name="glm5_next",
        factory=lazy_factory("metrale_glm_kda.loader:load_glm5_next"),
        model_types=("glm5_next", "glm5_next_text"),
        architectures=("Glm5NextForConditionalGeneration",),
        description="GLM-5.3-Flash text decoder (KDA + DSA/MLA attention, mHC, sigmoid MoE)",
        weight_formats=WEIGHT_FORMATS,
        tensor_parallel_note="its KDA recurrent state, MLA latent cache and MoE experts are not "
        "sharded yet (the tensor-parallel workers keep no recurrent-state pool)",
    )
)
