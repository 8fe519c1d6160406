"""``DecoderLM``: a decoder built from its definition, over the paged KV cache.

Owner: ``metrale_core.decoder``; implements ``metrale_core.model_api.CausalLM``.

Invariants:
- ``forward`` consumes a flat batch mixing prefill chunks, decode rows and verify rows; it writes
  every row's K/V (post-norm, post-RoPE keys) into ``kv`` (through ``kv.write``, so a KV-dtype
  codec such as FP8 sees exactly what is cached) before attending, and returns float32
  logits ``[N, vocab]`` for ``batch.logits_rows`` only (the head runs on those rows alone).
- Residual layers in the recipe's norm placement (``spec.Norms``):
  ``h = x + out_a(attn(in_a(x)))``, ``y = h + out_m(mlp(in_m(h)))``, each norm present or the
  identity.  With the default recipe (pre-norms only) this is exactly the Llama layer, op for op.
- QK-norm ``head`` normalises each head inside ``qk_norm_rope``; ``proj`` normalises the whole q
  and k projections first (then RoPE alone).
- The model keeps no recurrent state: ``make_state_pool`` returns None and ``state`` is ignored.
- Ops are built once per model, so the kernel path is chosen once.
- Under tensor parallelism the model is one rank's shard (``weights.heads`` says which heads):
  ``info.kv`` lists this rank's KV heads (its shard of the cache), ``info.vocab_size`` the whole
  vocabulary, and only rank 0's logits are the whole rows.
"""

from __future__ import annotations

import torch

from metrale_core.decoder.dims import DecoderDims
from metrale_core.decoder.spec import DecoderSpec
from metrale_core.decoder.weights import DecoderWeights, LayerWeights
from metrale_core.layers import (
    AttentionPlan,
    DecoderOps,
    embed_tokens,
    paged_attention,
    rope_cos_sin,
    rope_inv_freq,
)
from metrale_core.model_api import ForwardBatch, KVLayout, ModelInfo, PagedKVCache

__all__ = ["DecoderLM"]


class DecoderLM:
    """A loaded decoder; see the module docstring."""

    def __init__(
        self,
        spec: DecoderSpec,
        dims: DecoderDims,
        weights: DecoderWeights,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        self.spec = spec
        self.dims = dims
        self.weights = weights
        self.dtype = dtype
        self.device = torch.device(device)
        heads = weights.heads
        self.num_heads = dims.num_heads if heads is None else heads.num_heads
        self.num_kv_heads = dims.num_kv_heads if heads is None else heads.num_kv_heads
        self.info = ModelInfo(
            architecture=spec.name,
            vocab_size=dims.vocab_size,
            max_position=dims.max_position,
            kv=KVLayout(
                num_layers=dims.num_layers, num_kv_heads=self.num_kv_heads, head_dim=dims.head_dim, dtype=dtype
            ),
            eos_token_ids=dims.eos_token_ids,
            dtype=dtype,
        )
        self.ops = DecoderOps(self.device)
        self.inv_freq = rope_inv_freq(dims.head_dim, dims.rope_theta, dims.rope_scaling).to(self.device)
        self._scale = dims.head_dim**-0.5

    def __repr__(self) -> str:
        d = self.dims
        return (
            f"DecoderLM({self.info.architecture}, layers={d.num_layers}, hidden={d.hidden_size}, "
            f"heads={d.num_heads}/{d.num_kv_heads}x{d.head_dim}, dtype={self.dtype}, {self.ops})"
        )

    def make_state_pool(self, num_slots: int) -> None:
        return None

    @torch.no_grad()
    def forward(self, batch: ForwardBatch, kv: PagedKVCache | None, state: object | None = None) -> torch.Tensor:
        return self._run(batch, kv, None, all_hidden=False)[0]

    @torch.no_grad()
    def forward_with_hidden(
        self,
        batch: ForwardBatch,
        kv: PagedKVCache | None,
        state: object | None = None,
        *,
        inputs_embeds: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward`` plus the final-normed hidden states ``[T, D]`` of every row (the model
        contract's optional extension, read by MTP heads); ``inputs_embeds`` ``[T, D]`` replaces
        the token embeddings (an MTP block feeds its projected inputs this way)."""
        logits, hidden = self._run(batch, kv, inputs_embeds, all_hidden=True)
        assert hidden is not None  # all_hidden=True keeps them
        return logits, hidden

    def _run(
        self, batch: ForwardBatch, kv: PagedKVCache | None, inputs_embeds: torch.Tensor | None, all_hidden: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if kv is None or len(kv.k) != self.dims.num_layers:
            raise ValueError(f"{self.info.architecture} needs a paged KV cache with {self.dims.num_layers} layers")
        cos, sin = rope_cos_sin(batch.positions, self.inv_freq, self.dtype)
        plan = AttentionPlan.from_batch(batch, self._scale, gather=self.ops.decode_attention.path == "native")
        if inputs_embeds is not None:
            x = inputs_embeds.to(self.dtype)
        elif self.weights.embedding is not None:
            x = self.weights.embedding(batch.input_ids)
        else:
            x = embed_tokens(batch.input_ids, self.weights.embed)
        for i, layer in enumerate(self.weights.layers):
            x = self._layer(x, layer, kv, i, batch, plan, cos, sin)
        hidden = None
        if all_hidden:
            hidden = self.ops.rms_norm(x, self.weights.norm, self.dims.rms_norm_eps)
            x = hidden[batch.logits_rows]
        else:
            x = self.ops.rms_norm(x[batch.logits_rows], self.weights.norm, self.dims.rms_norm_eps)
        return self.weights.head(x).float(), hidden

    def _norm(self, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        """The recipe's RMSNorm, or the identity where the recipe has none (``weight`` None)."""
        return x if weight is None else self.ops.rms_norm(x, weight, self.dims.rms_norm_eps)

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
        ops = self.ops
        h = self._norm(x, w.attn_norm)
        qkv = w.qkv(h)
        q_size, kv_size = self.num_heads * d.head_dim, self.num_kv_heads * d.head_dim
        q, k, v = qkv.split_with_sizes([q_size, kv_size, kv_size], dim=-1)
        q_norm, k_norm = w.q_norm, w.k_norm
        if d.qk_norm == "proj":  # over the whole projection, before the heads are split
            q, k, q_norm, k_norm = self._norm(q, q_norm), self._norm(k, k_norm), None, None
        q = q.view(-1, self.num_heads, d.head_dim)
        k = k.view(-1, self.num_kv_heads, d.head_dim)
        v = v.view(-1, self.num_kv_heads, d.head_dim)
        q, k = ops.qk_norm_rope(q, k, q_norm, k_norm, cos, sin, d.rms_norm_eps)
        kv.write(index, batch.slot_mapping, k, v, kernel=ops.kv_write)
        o = paged_attention(q, kv, index, plan, ops.decode_attention, ops.prefill_attention)
        x = x + self._norm(w.o_proj(o.reshape(-1, q_size)), w.attn_out_norm)
        h = self._norm(x, w.mlp_norm)
        act = ops.swiglu(w.gate_up(h))
        return x + self._norm(w.down(act), w.mlp_out_norm)
