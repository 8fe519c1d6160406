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
  and k projections first (then RoPE alone).  A NoPE layer (``dims.ropes``) skips the rotation;
  partial rotary dimensions rotate the leading ``dims.rotary_dim`` of each head (``rope``).  The
  sliding layers rotate with their own table where ``dims.local_theta`` is set (Gemma 3's local
  base), the others with the global one; each table is computed once per forward.
- Windows (``dims.windows``) are declared in ``info.kv.windows``, so the core's KV groups keep a
  sliding layer's blocks only while its window sees them; each layer writes and reads through
  its group's tables (``batch.for_group``), planned once per group per forward.  A layer with a
  window, an attention soft-cap or attention sinks (``LayerWeights.sinks``) attends through
  ``windowed_paged_attention``, the others through ``paged_attention``; without windows there is
  one group and the Llama path.
- The scalars (``dims``): token embeddings times ``embedding_scale`` (in the activation dtype),
  each branch times ``residual_scale`` before its add, the softmax scale ``attn_scale``, the
  logits divided by ``logits_divisor`` and then soft-capped (``final_softcap``), in float32.
  ``unit_offset`` norms run ``rms_norm(..., unit_offset=True)`` (a per-head QK-norm too).
- A latent-attention layer (``dims.mla``) attends through ``layers.mla.mla_attention``: its cache
  is one KV head of ``kv_lora_rank + qk_rope_head_dim`` per token (``info.kv``), its RoPE tables
  are ``qk_rope_head_dim`` wide, and its per-head products run row by row outside ``exact``.
- A sparse layer's MLP is its ``MoeBlock`` (``metrale_core.layers.blocks.moe``: routed experts grouped
  per expert, the shared expert, the same SwiGLU op -- or gpt-oss's clamped ``swiglu_oai``, its
  sigmoid row by row outside ``exact``), in the same norm placement.
- The model keeps no recurrent state: ``make_state_pool`` returns None and ``state`` is ignored.
- ``lora_targets()`` is the weights' declaration (``DecoderWeights.lora``) seen from the model, so
  every family on the definition can take LoRA adapters without code of its own.
- Ops are built once per model, so the kernel path is chosen once.
- Under tensor parallelism the model is one rank's shard (``weights.heads`` says which heads):
  ``info.kv`` lists this rank's KV heads (its shard of the cache), ``info.vocab_size`` the whole
  vocabulary, and only rank 0's logits are the whole rows (the final scalars apply to them).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from attrs import evolve

from metrale_core.decoder.dims import DecoderDims
from metrale_core.decoder.mla import LATENT_EPS
from metrale_core.decoder.rope import RopeTables
from metrale_core.decoder.spec import DecoderSpec
from metrale_core.decoder.weights import DecoderWeights, LayerWeights
from metrale_core.layers import (
    AttentionPlan,
    DecoderOps,
    GeGLU,
    apply_rope,
    embed_tokens,
    paged_attention,
    rms_norm,
    windowed_paged_attention,
)
from metrale_core.layers.blocks.mla import mla_attention
from metrale_core.layers.blocks.moe import swiglu_oai
from metrale_core.layers.lowrank.lora_targets import LoRATargets
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
        windowed = any(w is not None for w in dims.windows)
        mla = dims.mla
        self.info = ModelInfo(
            architecture=spec.name,
            vocab_size=dims.vocab_size,
            max_position=dims.max_position,
            kv=KVLayout(
                num_layers=dims.num_layers,
                num_kv_heads=self.num_kv_heads if mla is None else 1,
                head_dim=dims.head_dim if mla is None else mla.shape.latent + mla.shape.rope,
                dtype=dtype,
                windows=dims.windows if windowed else (),
            ),
            eos_token_ids=dims.eos_token_ids,
            dtype=dtype,
        )
        self.ops = DecoderOps(self.device)
        self.act = GeGLU(self.device) if spec.mlp.kind == "geglu" else self.ops.swiglu
        moe = dims.moe
        self.expert_act: Callable[[torch.Tensor], torch.Tensor] = self.act
        if moe is not None and moe.swiglu_alpha is not None and moe.swiglu_limit is not None:
            rowwise = weights.weight_format != "exact"
            self.expert_act = partial(swiglu_oai, alpha=moe.swiglu_alpha, limit=moe.swiglu_limit, rowwise=rowwise)
        self.rope = RopeTables(dims, self.device)
        #: The sliding layers' own rotation (``dims.local_theta``), else None.
        self.local_rope = (
            None
            if dims.local_theta is None
            else RopeTables(evolve(dims, rope_theta=dims.local_theta, rope_scaling=dims.local_scaling), self.device)
        )
        self._rope_of = tuple(dims.layer_rope(i) for i in range(dims.num_layers))
        self._scale = dims.attn_scale
        self._rowwise = weights.weight_format != "exact"
        assert self.info.kv is not None
        #: Per layer, its KV group (None: no windows, every layer in one group).
        self._group_of = self.info.kv.groups.group_of_layers() if windowed else None
        self._embed_scale = None if dims.embedding_scale is None else torch.tensor(dims.embedding_scale, dtype=dtype)

    def __repr__(self) -> str:
        d = self.dims
        return (
            f"DecoderLM({self.info.architecture}, layers={d.num_layers}, hidden={d.hidden_size}, "
            f"heads={d.num_heads}/{d.num_kv_heads}x{d.head_dim}, dtype={self.dtype}, {self.ops})"
        )

    def make_state_pool(self, num_slots: int) -> None:
        return None

    def lora_targets(self) -> LoRATargets:
        """The projections LoRA may wrap, by their paths from this model (``weights.lora``)."""
        return self.weights.lora.under("weights")

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
        tables = [self.rope.cos_sin(batch.positions, self.dtype)]
        if self.local_rope is not None:
            tables.append(self.local_rope.cos_sin(batch.positions, self.dtype))
        groups, plans, group_of = self._groups(batch, kv)
        if inputs_embeds is not None:
            x = inputs_embeds.to(self.dtype)
        else:
            if self.weights.embedding is not None:
                x = self.weights.embedding(batch.input_ids)
            else:
                x = embed_tokens(batch.input_ids, self.weights.embed)
            if self._embed_scale is not None:
                x = x * self._embed_scale
        for i, layer in enumerate(self.weights.layers):
            g = group_of[i]
            x = self._layer(x, layer, kv, i, groups[g], plans[g], *tables[self._rope_of[i]])
        hidden = None
        if all_hidden:
            hidden = self._norm(x, self.weights.norm)
            x = hidden[batch.logits_rows]
        else:
            x = self._norm(x[batch.logits_rows], self.weights.norm)
        logits = self.weights.head(x).float()
        d = self.dims
        if d.logits_divisor is not None:
            logits = logits / d.logits_divisor
        if d.final_softcap is not None:
            logits = torch.tanh(logits / d.final_softcap) * d.final_softcap
        return logits, hidden

    def _groups(
        self, batch: ForwardBatch, kv: PagedKVCache
    ) -> tuple[list[ForwardBatch], list[AttentionPlan], tuple[int, ...]]:
        """Each KV group's view of ``batch``, its attention plan, and every layer's group."""
        gather = self.ops.decode_attention.path == "native"
        n = self.dims.num_layers
        if self._group_of is None:
            return [batch], [AttentionPlan.from_batch(batch, self._scale, gather=gather)], (0,) * n
        # a batch without group tables comes from an engine that keeps every layer in one group
        # (its cache declares no windows: one tensor per layer)
        group_of = self._group_of if batch.group_block_tables else (0,) * n
        if not batch.group_block_tables and len({id(t) for t in kv.k}) != n:
            raise ValueError("this KV cache shares tensors between KV groups; the batch needs their block tables")
        groups = [batch.for_group(g) for g in range(max(group_of) + 1)]
        return groups, [AttentionPlan.from_batch(b, self._scale, gather=gather) for b in groups], group_of

    def _norm(self, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        """The recipe's RMSNorm, or the identity where the recipe has none (``weight`` None)."""
        if weight is None:
            return x
        if self.dims.unit_offset:
            return rms_norm(x, weight, self.dims.rms_norm_eps, unit_offset=True)
        return self.ops.rms_norm(x, weight, self.dims.rms_norm_eps)

    def _residual(self, x: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        scale = self.dims.residual_scale
        return x + (branch if scale is None else branch * scale)

    def _rotate(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        q_norm: torch.Tensor | None,
        k_norm: torch.Tensor | None,
        index: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head QK-norm (where given) and RoPE (where the layer has it) of ``q`` / ``k``."""
        d = self.dims
        rope = d.ropes[index]
        if q_norm is not None and (d.unit_offset or not rope or d.rotary_dim < d.head_dim):
            q, k, q_norm, k_norm = self._norm(q, q_norm), self._norm(k, k_norm), None, None
        if not rope:
            return q, k
        if d.rotary_dim == d.head_dim:
            return self.ops.qk_norm_rope(q, k, q_norm, k_norm, cos, sin, d.rms_norm_eps)
        r = d.rotary_dim
        q = torch.cat((apply_rope(q[..., :r], cos, sin), q[..., r:]), dim=-1)
        k = torch.cat((apply_rope(k[..., :r], cos, sin), k[..., r:]), dim=-1)
        return q, k

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
        if w.mla is not None:
            assert d.mla is not None  # a latent-attention layer of a latent-attention model
            o = mla_attention(
                h, w.mla, d.mla.shape, kv, index, batch, plan, ops, cos, sin, self._latent_norm, rowwise=self._rowwise
            )
            return self._mlp(self._residual(x, self._norm(w.o_proj(o), w.attn_out_norm)), w)
        assert w.qkv is not None  # a GQA layer
        qkv = w.qkv(h)
        q_size, kv_size = self.num_heads * d.head_dim, self.num_kv_heads * d.head_dim
        q, k, v = qkv.split_with_sizes([q_size, kv_size, kv_size], dim=-1)
        q_norm, k_norm = w.q_norm, w.k_norm
        if d.qk_norm == "proj":  # over the whole projection, before the heads are split
            q, k, q_norm, k_norm = self._norm(q, q_norm), self._norm(k, k_norm), None, None
        q = q.view(-1, self.num_heads, d.head_dim)
        k = k.view(-1, self.num_kv_heads, d.head_dim)
        v = v.view(-1, self.num_kv_heads, d.head_dim)
        q, k = self._rotate(q, k, q_norm, k_norm, index, cos, sin)
        kv.write(index, batch.slot_mapping, k, v, kernel=ops.kv_write)
        window = d.windows[index]
        if window is None and d.attn_softcap is None and w.sinks is None:
            o = paged_attention(q, kv, index, plan, ops.decode_attention, ops.prefill_attention)
        else:
            o = windowed_paged_attention(
                q,
                kv,
                index,
                plan,
                window=window,
                softcap=d.attn_softcap,
                sinks=w.sinks,
                decode_op=ops.decode_attention,
                prefill_op=ops.prefill_attention,
            )
        x = self._residual(x, self._norm(w.o_proj(o.reshape(-1, q_size)), w.attn_out_norm))
        return self._mlp(x, w)

    def _latent_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm(x, weight, LATENT_EPS)

    def _mlp(self, x: torch.Tensor, w: LayerWeights) -> torch.Tensor:
        """The layer's MLP half: ``x + out_m(mlp(in_m(x)))``, dense or its experts."""
        h = self._norm(x, w.mlp_norm)
        if w.moe is not None:
            return self._residual(x, self._norm(w.moe(h, self.expert_act), w.mlp_out_norm))
        assert w.gate_up is not None and w.down is not None  # a dense layer
        act = self.act(w.gate_up(h))
        return self._residual(x, self._norm(w.down(act), w.mlp_out_norm))
