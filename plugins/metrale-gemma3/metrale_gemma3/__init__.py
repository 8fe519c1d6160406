"""Metrale model plugin: the Gemma 3 text decoder, one decoder definition.

Owner: ``metrale_gemma3`` (entry point ``gemma3``).  Gemma 3 (transformers' ``Gemma3ForCausalLM``
and the text decoder of ``Gemma3ForConditionalGeneration``, ``model_type`` ``gemma3_text`` or
``gemma3`` with a ``text_config``; GGUF arch ``gemma3``): Gemma 2's recipe -- ``(1 + w)`` RMSNorms
before and after attention and the MLP, a GeGLU MLP, embeddings times ``sqrt(hidden_size)``, the
softmax scale ``query_pre_attn_scalar ** -0.5``, ``final_logit_softcapping`` where set -- plus a
per-head ``(1 + w)`` QK-norm before RoPE, every 6th layer global (``layer_types``, else
``sliding_window_pattern``) and the others sliding over ``sliding_window`` positions, rotating
with their own base (``rope_local_base_freq``, 10,000) while the global layers take
``rope_theta`` and its scaling.  ``attn_logit_softcapping`` is not applied: Gemma 3 configs carry
it, but neither transformers' ``Gemma3Attention`` nor llama.cpp's gemma3 graph uses it.  The core
builds the model (``metrale_core.api.DecoderSpec``): weights in every format, tensor
parallelism, LoRA, a multimodal checkpoint's text tensors (``model.language_model.``); the GGUF
store fills the config from the metadata (window, pattern, scale, the ``<end_of_turn>`` id).

Kept as its own distribution (not in metrale-qwen3's family group): ``metrale-gemma3`` and its
entry point ``gemma3`` are what users install and what its tests check; the plugin is now this
definition and :class:`~metrale_gemma3.config.Gemma3Dims`, the name of its config reading.

Invariants: this package imports neither torch nor CuPy (the definition builds its model only when
its factory is called, so ``met plugins`` stays fast).
"""

from __future__ import annotations

from metrale_core import hookimpl
from metrale_core.api import GEMMA_NAMES, Attention, DecoderSpec, LayerPattern, Mlp, Norms, Scalars

__all__ = ["GEMMA3", "WEIGHT_FORMATS", "metrale_model_loaders"]

GEMMA3 = DecoderSpec(
    "gemma3",
    ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"),
    "Gemma 3 text decoder (sliding-window + global attention, GeGLU, QK-norm)",
    model_types=("gemma3_text", "gemma3"),
    norms=Norms(post_attn=True, post_mlp=True, unit_offset=True),
    attention=Attention(qk_norm="head", scale="query_pre_attn_scalar**-0.5"),
    mlp=Mlp(kind="geglu", bias="never"),
    layers=LayerPattern(sliding_window="sliding_window", global_every=6, sliding_rope_theta="rope_local_base_freq"),
    scalars=Scalars(embedding="hidden_size**0.5", final_softcap="final_logit_softcapping"),
    names=GEMMA_NAMES,
    activations=("gelu_pytorch_tanh", "gelu_tanh"),
    default_max_position=131_072,
)

#: The ``--weight-format`` values the loader honours (every definition's).
WEIGHT_FORMATS = GEMMA3.weight_formats


@hookimpl
def metrale_model_loaders(register) -> None:
    """Register the gemma3 loader."""
    register(GEMMA3.loader_spec())
