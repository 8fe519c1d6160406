"""Metrale model plugin: the Phi-3 decoder (Phi-3 / Phi-3.5-mini, Phi-4-mini), one decoder definition.

Owner: ``metrale_qwen3`` (entry point ``phi3``).  Phi-3 is Llama with fused checkpoint tensors --
``qkv_proj`` (``[q; k; v]``) and ``gate_up_proj`` (``[gate; up]``) -- no biases, a sliding window
over every layer (the config's ``sliding_window``), LongRoPE (``rope_scaling`` with short and long
factors, ``original_max_position_embeddings``; the core's ``decoder.rope``) and, in Phi-4-mini,
``partial_rotary_factor`` 0.75.  Tensor parallelism is refused with the definition's reason (the
fused tensors' per-rank slices are not built).  GGUF arch ``phi3`` (llama.cpp's converter): the
fused tensors are ``attn_qkv`` and ``ffn_up`` (``2 * intermediate`` rows: the fused MLP's slot),
unpermuted; the GGUF store turns the window, ``rope.dimension_count`` and the LongRoPE factor
tensors (``rope_factors_short`` / ``rope_factors_long``) into the config keys read here.

Invariants: this module imports no torch; the core builds the model when the factory runs.
"""

from __future__ import annotations

from metrale_core.api import LLAMA_NAMES, Attention, DecoderSpec, LayerPattern, Mlp, registers

__all__ = ["PHI3", "metrale_model_loaders"]

PHI3 = DecoderSpec(
    "phi3",
    "Phi3ForCausalLM",
    "Phi-3 / Phi-3.5 / Phi-4-mini decoder (fused qkv and gate_up, LongRoPE, partial rotary)",
    attention=Attention(fused_qkv=True, qkv_bias="never", o_bias="never"),
    mlp=Mlp(fused_gate_up=True, bias="never"),
    layers=LayerPattern(sliding_window="sliding_window"),
    names=LLAMA_NAMES.replace(gate_up=("model.layers.{i}.mlp.gate_up_proj", "blk.{i}.ffn_up")),
)


metrale_model_loaders = registers(PHI3.loader_spec())
