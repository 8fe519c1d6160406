"""``Gemma3LM``: the Gemma 3 text decoder over the paged KV cache.

Owner: ``metrale_gemma3``; implements ``metrale_core.model_api.CausalLM``.

Invariants:
- ``forward`` consumes a flat batch mixing prefill chunks, decode rows and verify rows; it writes
  every row's K/V (post-QK-norm, post-RoPE keys) into ``kv`` through ``kv.write`` before
  attending, and returns float32 logits ``[N, vocab]`` for ``batch.logits_rows`` only.
- Embeddings are scaled by ``sqrt(hidden)`` (in the activation dtype, as HF); every layer is
  ``h = x + post_attn_norm(attn(input_norm(x)))``, ``y = h + post_ffn_norm(geglu(pre_ffn_norm(h)))``
  with the ``(1 + w)`` RMSNorm (``rms_norm(..., unit_offset=True)``).
- Sliding layers attend within ``dims.sliding_window`` positions and rotate with the local RoPE
  base; global layers attend to the whole context with the global base (and its scaling).
  ``info.kv.windows`` declares them, so the core's KV groups keep a sliding layer's blocks only
  while its window sees them; each layer writes and reads through its group's tables
  (``batch.for_group``), planned once per group per forward.
  The softmax scale is ``query_pre_attn_scalar ** -0.5``; ``final_logit_softcapping`` applies
  where the config sets it (``attn_logit_softcapping`` does not, as in transformers and llama.cpp).
- Under tensor parallelism the model is one rank's shard (``weights.heads``; o_proj and down_proj
  sum over the ranks before their post-norms; the soft-cap applies to rank 0's whole logits).
- The model keeps no recurrent state: ``make_state_pool`` returns None and ``state`` is ignored.
"""

from __future__ import annotations

import torch

from metrale_core.api import (
    AttentionPlan,
    DecoderOps,
    ForwardBatch,
    GeGLU,
    KVLayout,
    ModelInfo,
    PagedKVCache,
    embed_tokens,
    paged_attention,
    rms_norm,
    rope_cos_sin,
    rope_inv_freq,
    windowed_paged_attention,
)
from metrale_gemma3.config import Gemma3Dims
from metrale_gemma3.weights import Gemma3Weights, LayerWeights

__all__ = ["Gemma3LM"]


class Gemma3LM:
    """A loaded Gemma 3 decoder; see the module docstring."""

    def __init__(
        self,
        dims: Gemma3Dims,
        weights: Gemma3Weights,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        self.dims = dims
        self.weights = weights
        self.dtype = dtype
        self.device = torch.device(device)
        heads = weights.heads
        self.num_heads = dims.num_heads if heads is None else heads.num_heads
        self.num_kv_heads = dims.num_kv_heads if heads is None else heads.num_kv_heads
        self.info = ModelInfo(
            architecture="gemma3",
            vocab_size=dims.vocab_size,
            max_position=dims.max_position,
            kv=KVLayout(
                num_layers=dims.num_layers,
                num_kv_heads=self.num_kv_heads,
                head_dim=dims.head_dim,
                dtype=dtype,
                windows=tuple(dims.window(i) for i in range(dims.num_layers)),
            ),
            eos_token_ids=dims.eos_token_ids,
            dtype=dtype,
        )
        self.ops = DecoderOps(self.device)
        self.geglu = GeGLU(self.device)
        self.inv_freq = {
            "full_attention": rope_inv_freq(dims.head_dim, dims.global_theta, dims.global_scaling).to(self.device),
            "sliding_attention": rope_inv_freq(dims.head_dim, dims.local_theta, dims.local_scaling).to(self.device),
        }
        self._embed_scale = torch.tensor(dims.hidden_size**0.5, dtype=dtype)
        #: Per layer, its KV group (the core keeps a sliding layer's blocks only while its
        #: window can see them; each group has its own block tables and slots).
        assert self.info.kv is not None  # a Gemma 3 model declares its KV layout
        self._group_of = self.info.kv.groups.group_of_layers()

    def __repr__(self) -> str:
        d = self.dims
        return (
            f"Gemma3LM(layers={d.num_layers} ({d.layer_types.count('sliding_attention')} sliding, window "
            f"{d.sliding_window}), hidden={d.hidden_size}, heads={d.num_heads}/{d.num_kv_heads}x"
            f"{d.head_dim}, dtype={self.dtype}, {self.ops})"
        )

    def make_state_pool(self, num_slots: int) -> None:
        return None

    @torch.no_grad()
    def forward(self, batch: ForwardBatch, kv: PagedKVCache | None, state: object | None = None) -> torch.Tensor:
        d = self.dims
        if kv is None or len(kv.k) != d.num_layers:
            raise ValueError(f"gemma3 needs a paged KV cache with {d.num_layers} layers")
        rope = {
            kind: rope_cos_sin(batch.positions, inv, self.dtype)
            for kind, inv in self.inv_freq.items()
            if kind in d.layer_types
        }
        gather = self.ops.decode_attention.path == "native"
        # a batch without group tables comes from an engine that keeps every layer in one group
        # (its cache declares no windows: one tensor per layer)
        group_of = self._group_of if batch.group_block_tables else (0,) * d.num_layers
        if not batch.group_block_tables and len({id(t) for t in kv.k}) != d.num_layers:
            raise ValueError("this KV cache shares tensors between KV groups; the batch needs their block tables")
        groups = [batch.for_group(g) for g in range(max(group_of) + 1)]
        plans = [AttentionPlan.from_batch(b, d.attn_scale, gather=gather) for b in groups]
        embedding = self.weights.embedding
        rows = embed_tokens(batch.input_ids, self.weights.embed) if embedding is None else embedding(batch.input_ids)
        x = rows * self._embed_scale
        for i, layer in enumerate(self.weights.layers):
            g = group_of[i]
            x = self._layer(x, layer, kv, i, groups[g], plans[g], *rope[d.layer_types[i]])
        x = rms_norm(x[batch.logits_rows], self.weights.norm, d.rms_norm_eps, unit_offset=True)
        logits = self.weights.head(x).float()
        if d.final_softcap is not None:
            logits = torch.tanh(logits / d.final_softcap) * d.final_softcap
        return logits

    def _attend(self, q: torch.Tensor, kv: PagedKVCache, index: int, plan: AttentionPlan) -> torch.Tensor:
        window = self.dims.window(index)
        if window is None:
            return paged_attention(q, kv, index, plan, self.ops.decode_attention, self.ops.prefill_attention)
        return windowed_paged_attention(q, kv, index, plan, window=window)

    def _layer(
        self,
        x: torch.Tensor,
        w: LayerWeights,
        kv: PagedKVCache,
        index: int,
        batch: ForwardBatch,
        plan: AttentionPlan,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        d = self.dims
        eps = d.rms_norm_eps
        h = rms_norm(x, w.input_norm, eps, unit_offset=True)
        q_size, kv_size = self.num_heads * d.head_dim, self.num_kv_heads * d.head_dim
        q, k, v = w.qkv(h).split_with_sizes([q_size, kv_size, kv_size], dim=-1)
        q = q.reshape(-1, self.num_heads, d.head_dim)
        k = k.reshape(-1, self.num_kv_heads, d.head_dim)
        v = v.reshape(-1, self.num_kv_heads, d.head_dim)
        q, k = self.ops.qk_norm_rope(q, k, w.q_norm, w.k_norm, cos, sin, eps)
        kv.write(index, batch.slot_mapping, k, v, kernel=self.ops.kv_write)
        o = self._attend(q, kv, index, plan)
        x = x + rms_norm(w.o_proj(o.reshape(-1, q_size)), w.post_attn_norm, eps, unit_offset=True)
        h = rms_norm(x, w.pre_ffn_norm, eps, unit_offset=True)
        h = w.down(self.geglu(w.gate_up(h)))
        return x + rms_norm(h, w.post_ffn_norm, eps, unit_offset=True)
