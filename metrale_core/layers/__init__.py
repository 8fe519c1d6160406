"""Shared model building blocks: every model plugin builds its decoder from these layers.

Owner: ``metrale_core.layers``.  Each hot op is a :class:`~metrale_core.kernels.CustomOp` with a
torch oracle (``forward_native``), a CuPy kernel (``kernels/*.cu``) and, where it pays, a C CPU
kernel (``kernels/cpu/*.c``):

- norms: :class:`RMSNorm` (``functional.rms_norm``; the cast order is a parameter);
- RoPE: :func:`rope_inv_freq` (default / linear / llama3 scaling), :func:`rope_cos_sin`,
  :func:`apply_rope`, fused with the per-head QK-norm in :class:`QKNormRope`;
- gated MLPs: :class:`SwiGLU`, :class:`GeGLU`;
- embedding and head: :class:`Embedding`, :func:`build_embedding` / :func:`embed_tokens` (a
  quantized GGUF table read in place); the head is a :func:`build_linear` projection;
- linear: :func:`build_linear` in a weight format (``auto`` / ``exact`` / ``bf16`` / ``int8`` / ``int4``),
  so every model plugin gets the formats for free; :func:`require_weight_format` is how a loader
  that cannot honour a format refuses it;
- paged attention: :class:`AttentionPlan`, :func:`paged_attention`, the decode / prefill /
  KV-write ops.  The decode CUDA kernel is one template over how a K/V row is loaded
  (``metrale_core/kernels/include/metrale_paged_attention.cuh``): a KV codec such as FP8
  instantiates it with its own loader.  :func:`windowed_paged_attention` is the torch path for
  layers with a sliding window and/or logit soft-capping (Gemma).

- tensor parallelism (:mod:`metrale_core.layers.parallel`): the rank's group, sharded weight
  stores, row-parallel / vocab-parallel layers and the head gathered on rank 0;
- LoRA (:mod:`metrale_core.layers.lowrank.lora`): the per-row adapter wrapper, put at the projections a
  model declares (``lora_targets()``, :mod:`metrale_core.layers.lowrank.lora_targets`).

Rooms by kind: ``pointwise/`` (norms, RoPE, gated activations: the oracles and their ops),
``formats/`` (linear layers in their weight formats, GGUF blocks, the CPU matmuls, the repack
cache), ``lowrank/`` (LoRA), ``blocks/`` (MoE, MLA); paged attention (``attention``,
``window_attention``, ``ops``, ``kv_cache_write``), ``op_support`` (what the ops share),
``decoder_ops``, ``parallel`` and ``dtypes`` sit at the top with the kernel sources (``kernels/``).

Invariants: the oracles follow HF transformers (see ``pointwise/functional.py``); :class:`DecoderOps`
builds each op once per model so its path is chosen once; plugins import these names from
:mod:`metrale_core.api` (or from here), never a plugin's copy.
"""

from __future__ import annotations

from metrale_core.layers.attention import AttentionPlan, paged_attention, write_kv
from metrale_core.layers.decoder_ops import DecoderOps
from metrale_core.layers.dtypes import DTYPES, torch_dtype
from metrale_core.layers.formats.linear import (
    WEIGHT_FORMAT_ENV,
    WEIGHT_FORMATS,
    Linear,
    build_embedding,
    build_linear,
    build_tied_head,
    embed_tokens,
    require_weight_format,
    resolve_weight_format,
)
from metrale_core.layers.formats.linear_kinds import DenseLinear
from metrale_core.layers.kv_cache_write import KVCacheWrite
from metrale_core.layers.ops import PagedAttentionDecode, PagedAttentionPrefill
from metrale_core.layers.pointwise.functional import (
    apply_rope,
    geglu,
    rms_norm,
    rope_cos_sin,
    rope_inv_freq,
    signed_sin,
    swiglu,
)
from metrale_core.layers.pointwise.native_ops import Embedding, GeGLU
from metrale_core.layers.pointwise.norm_ops import QKNormRope, RMSNorm, SwiGLU
from metrale_core.layers.window_attention import windowed_paged_attention

__all__ = [
    "DTYPES",
    "WEIGHT_FORMATS",
    "WEIGHT_FORMAT_ENV",
    "AttentionPlan",
    "DecoderOps",
    "DenseLinear",
    "Embedding",
    "GeGLU",
    "KVCacheWrite",
    "Linear",
    "PagedAttentionDecode",
    "PagedAttentionPrefill",
    "QKNormRope",
    "RMSNorm",
    "SwiGLU",
    "apply_rope",
    "build_embedding",
    "build_linear",
    "build_tied_head",
    "embed_tokens",
    "geglu",
    "paged_attention",
    "require_weight_format",
    "resolve_weight_format",
    "rms_norm",
    "rope_cos_sin",
    "rope_inv_freq",
    "signed_sin",
    "swiglu",
    "torch_dtype",
    "windowed_paged_attention",
    "write_kv",
]
