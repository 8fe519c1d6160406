"""GGUF -> Hugging Face translation: tensor names, config keys and llama's Q/K row permutation.

Owner: ``metrale_core.weights`` (used by ``gguf_store``).

Invariants:
- ``hf_name`` maps the llama.cpp names of the llama / qwen2 / qwen3 decoder (``token_embd``,
  ``blk.N.attn_q``, ...) to HF names and returns None for any other name; the store keeps such
  names (e.g. ``rope_freqs.weight``) unchanged.  The table is the decoder definitions' own
  (``metrale_core.decoder.names.LLAMA_NAMES``, its GGUF and HF columns).
- Only archs in ``PERMUTED_ARCHS`` had Q/K rows permuted by llama.cpp's ``convert_hf_to_gguf``
  (``LlamaModel.permute``, applied to q/k weights and biases: llama, granite, smollm3).
  Qwen2/Qwen3/OLMo 2/Gemma are written unpermuted.
- Arch-specific metadata (Granite's multipliers, Gemma 2's window and soft-caps, Phi-3's window,
  partial rotary and LongRoPE factors, the MoE archs' expert count, top-k, expert widths and top-k
  renormalisation, DeepSeek-V2's latent attention and routing) becomes the HF config keys the
  definitions read (``gguf_arch.arch_config``, after the llama-shaped keys); the stacked expert
  tensors keep their GGUF names (``metrale_core.weights.ExpertSlices`` serves them per expert).
- An arch not in ``ARCHITECTURES`` gets no ``architectures`` entry and only the config keys its
  metadata has (a missing one is None, not an error), so the loader lookup can refuse it by name.
- Shapes are the file's, reversed, but for Qwen2-MoE's shared-expert gate (HF ``[1, D]``), which
  a file may hold 1-D and is served 2-D (``hf_shape``).
- ``unpermute_rows`` is the exact inverse of that permutation and works on any row payload
  (float rows or quantized byte rows, since blocks never straddle rows).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from metrale_core.decoder.names import LLAMA_NAMES
from metrale_core.errors import CorruptWeightsFile
from metrale_core.weights.gguf_arch import arch_config

__all__ = [
    "ARCHITECTURES",
    "PERMUTED_ARCHS",
    "hf_name",
    "hf_shape",
    "permute_heads",
    "synthesize_config",
    "unpermute_rows",
]

#: GGUF ``general.architecture`` -> HF ``architectures`` entry.
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",  # as gemma2, plus QK-norm, two RoPE bases and its end of turn (gguf_arch)
    "olmo2": "Olmo2ForCausalLM",  # its post-norms keep their GGUF names (the olmo2 definition reads them)
    "granite": "GraniteForCausalLM",  # its multipliers come from the metadata (gguf_arch)
    "smollm3": "SmolLM3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",  # norms stored as 1 + w; windows and soft-caps from the metadata
    "phi3": "Phi3ForCausalLM",  # fused attn_qkv / ffn_up keep their GGUF names; LongRoPE from gguf_arch
    "qwen3moe": "Qwen3MoeForCausalLM",  # experts stacked in ffn_*_exps, read per expert (ExpertSlices)
    "qwen2moe": "Qwen2MoeForCausalLM",  # ... and a shared expert, ffn_*_shexp / ffn_gate_inp_shexp
    "deepseek2": "DeepseekV2ForCausalLM",  # latent attention and DeepSeek routing from gguf_arch
    "gpt-oss": "GptOssForCausalLM",  # sinks, windows, yarn from gguf_arch; MXFP4 experts in ffn_*_exps
}
#: llama.cpp's converters that permute Q/K rows (``LlamaModel`` and its subclasses).
PERMUTED_ARCHS = frozenset({"llama", "granite", "smollm3"})

#: The GGUF store's llama table (GGUF module path -> HF module path), derived from the decoder
#: definitions' weight-name table so the two cannot disagree: the slots a llama GGUF file holds.
_LLAMA_TOP_SLOTS = ("embed", "norm", "head")
_LLAMA_BLOCK_SLOTS = ("q", "k", "v", "o", "q_norm", "k_norm", "attn_norm", "mlp_norm", "gate", "up", "down")
_TOP = {LLAMA_NAMES.table[s][1]: LLAMA_NAMES.table[s][0] for s in _LLAMA_TOP_SLOTS}
_BLOCK = {
    LLAMA_NAMES.table[s][1].removeprefix("blk.{i}."): LLAMA_NAMES.table[s][0].removeprefix("model.layers.{i}.")
    for s in _LLAMA_BLOCK_SLOTS
}


#: GGUF tensors HF stores as one row ``[1, D]`` that a converter may write 1-D (``{n_embd}``, the
#: shape llama.cpp's loader asks for): served as ``[1, D]`` either way.
_ROW_VECTORS = frozenset({"ffn_gate_inp_shexp"})


def hf_shape(gguf_name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The numpy (HF) shape of GGUF tensor ``gguf_name`` stored with ``shape`` (``shape`` itself,
    but a 1-D row vector of :data:`_ROW_VECTORS` as ``(1, D)``)."""
    base = gguf_name.rpartition(".")[0].rpartition(".")[2]
    return (1, *shape) if len(shape) == 1 and base in _ROW_VECTORS else shape


def hf_name(gguf_name: str) -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``; None if not a known name."""
    base, _, kind = gguf_name.rpartition(".")
    if kind not in ("weight", "bias"):
        return None
    if base in _TOP:
        return f"{_TOP[base]}.{kind}"
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _BLOCK:
        return f"model.layers.{int(parts[1])}.{_BLOCK[parts[2]]}.{kind}"
    return None


def permute_heads(arch: str, gguf_name: str, config: Mapping[str, Any]) -> int | None:
    """The head count to un-permute ``gguf_name`` with, or None when its rows are in HF order."""
    if arch not in PERMUTED_ARCHS:
        return None
    base = gguf_name.rpartition(".")[0]
    if base.startswith("blk.") and base.endswith(".attn_q"):
        return int(config["num_attention_heads"])
    if base.startswith("blk.") and base.endswith(".attn_k"):
        return int(config["num_key_value_heads"])
    return None


def unpermute_rows(a: np.ndarray, n_head: int) -> np.ndarray:
    """Undo ``LlamaModel.permute`` on dim 0 of ``a``; returns a new C-contiguous array."""
    out = a.shape[0]
    if out % (2 * n_head):
        raise ValueError(f"{out} rows cannot be split into {n_head} heads of paired rows")
    rest = a.shape[1:]
    return np.ascontiguousarray(a.reshape(n_head, out // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(a.shape))


def synthesize_config(
    where: str,
    scalars: Mapping[str, Any],
    n_tokens: int | None,
    shapes: Mapping[str, tuple[int, ...]],
    tensors: Mapping[str, np.ndarray] | None = None,
    token_id: Callable[[str], int | None] | None = None,
) -> dict[str, Any]:
    """An HF-style config dict from GGUF metadata.

    ``scalars`` holds the non-array metadata; ``n_tokens`` the length of ``tokenizer.ggml.tokens``;
    ``shapes`` the numpy (HF) shape of every tensor by GGUF name; ``tensors`` the values of the
    ``gguf_arch.CONFIG_TENSORS`` the file has; ``token_id(text)`` finds a token of the vocabulary
    (read only where an arch needs one).  ``where`` names the file in errors.
    """
    tensors = tensors or {}
    arch = scalars.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise CorruptWeightsFile(f"{where}: GGUF metadata lacks general.architecture")

    known = arch in ARCHITECTURES

    def key(name: str, default: Any = ...) -> Any:
        value = scalars.get(f"{arch}.{name}", default)
        if value is ... and known:
            raise CorruptWeightsFile(f"{where}: GGUF metadata lacks {arch}.{name}, needed for the model config")
        return None if value is ... else value  # an unmapped arch: what its metadata has

    def number(cast: Any, value: Any) -> Any:
        return None if value is None else cast(value)

    hidden = number(int, key("embedding_length"))
    heads = number(int, key("attention.head_count"))
    intermediate = scalars.get(f"{arch}.feed_forward_length")
    if intermediate is None and "blk.0.ffn_gate.weight" in shapes:
        intermediate = shapes["blk.0.ffn_gate.weight"][0]
    vocab = n_tokens or scalars.get(f"{arch}.vocab_size")
    if not vocab and "token_embd.weight" in shapes:
        vocab = shapes["token_embd.weight"][0]
    config: dict[str, Any] = {
        "model_type": arch,
        "architectures": [ARCHITECTURES[arch]] if known else [],
        "vocab_size": int(vocab) if vocab else None,
        "hidden_size": hidden,
        "intermediate_size": number(int, intermediate),
        "num_hidden_layers": number(int, key("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": number(int, key("attention.head_count_kv", heads)),
        "head_dim": number(int, key("attention.key_length", hidden // heads if hidden and heads else None)),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "max_position_embeddings": number(int, key("context_length")),
        "tie_word_embeddings": "output.weight" not in shapes,
        "attention_bias": "blk.0.attn_q.bias" in shapes,
        "mlp_bias": "blk.0.ffn_up.bias" in shapes,
        "hidden_act": "silu",
        "bos_token_id": scalars.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": scalars.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": scalars.get("tokenizer.ggml.padding_token_id"),
    }
    scaling = scalars.get(f"{arch}.rope.scaling.type")
    if isinstance(scaling, str) and scaling not in ("none", ""):
        config["rope_scaling"] = {
            "rope_type": scaling,
            "factor": float(key("rope.scaling.factor", 1.0)),
            "original_max_position_embeddings": number(
                int, key("rope.scaling.original_context_length", config["max_position_embeddings"])
            ),
        }
    arch_config(arch, scalars, tensors, config, token_id)
    return config
