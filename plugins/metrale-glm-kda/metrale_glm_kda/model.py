"""``GlmKdaLM``: the GLM-5.3 (``glm5_next``) text decoder over paged MLA cache + KDA state slots.

Owner: ``metrale_glm_kda``; implements ``metrale_core.model_api.CausalLM``.

Invariants:
- ``info.recurrent`` declares the KDA layers, so the engine allocates a :class:`KdaStatePool`
  (``make_state_pool``), keeps prefix caching off and replays preempted sequences from 0.
- Before anything is consumed, the slot of every sequence with ``state_fresh`` is zeroed; every
  other sequence continues the state of its slot, so consecutive prefill chunks carry the state.
- Each row is consumed exactly once per forward; decode rows (sequences feeding one row, as
  ``batch.split`` carries them from the scheduler: never re-derived here) go through the
  batched decode ops, multi-row sequences through the chunked (>= ``CHUNK_MIN_ROWS``
  rows) or recurrent form.
- Speculative verify chunks (``batch.verify_host``) run the recurrent form with a checkpoint
  (``verify.consume_verify_chunk``); ``commit_verify`` restores and replays the kept rows, so a
  slot ends bit for bit as if the rejected drafts had never been fed.
- The paged cache is read and written through its codec (``PagedKVCache.write`` / ``gather``),
  so any KV dtype works (fp8 stores the latent and the indexer rows quantized).
- Residual streams are ``[T, hc_mult, D]`` (mHC); logits are computed for ``logits_rows`` only
  from the mean of the streams, final norm and LM head, in float32.
- ``lora_targets()`` declares every projection but the head (``GlmWeights.lora``) for LoRA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from metrale_core.api import (
    ForwardBatch,
    KVLayout,
    LoRATargets,
    ModelInfo,
    PagedKVCache,
    RecurrentLayout,
    rms_norm,
)
from metrale_glm_kda import kda
from metrale_glm_kda.config import GlmDims
from metrale_glm_kda.hc import hc_collapse, hc_expand
from metrale_glm_kda.mla import MlaWeights, SeqRows, mla_attention
from metrale_glm_kda.moe import MlpWeights, mlp_forward, moe_forward
from metrale_glm_kda.ops import GlmOps
from metrale_glm_kda.state import KdaStatePool, state_bytes_per_sequence
from metrale_glm_kda.verify import consume_verify_chunk, rollback
from metrale_glm_kda.weights import GlmWeights, KdaWeights

__all__ = ["CHUNK_MIN_ROWS", "GlmKdaLM"]

#: Multi-row sequences with at least this many rows use the chunked KDA form.
CHUNK_MIN_ROWS = 16


class GlmKdaLM:
    """A loaded GLM-5.3 text decoder; see the module docstring."""

    def __init__(
        self,
        dims: GlmDims,
        weights: GlmWeights,
        *,
        architecture: str = "glm5_next",
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        self.dims = dims
        self.weights = weights
        self.dtype = dtype
        self.device = torch.device(device)
        mla = dims.mla_layers
        self.info = ModelInfo(
            architecture=architecture,
            vocab_size=dims.vocab_size,
            max_position=dims.max_position,
            kv=KVLayout(
                num_layers=len(mla),
                num_kv_heads=1,
                head_dim=dims.kv_lora_rank,
                dtype=dtype,
                v_head_dim=dims.indexer_cache_dim,
            )
            if mla
            else None,
            recurrent=RecurrentLayout(
                num_layers=len(dims.kda_layers), bytes_per_sequence=state_bytes_per_sequence(dims, dtype)
            ),
            eos_token_ids=dims.eos_token_ids,
            dtype=dtype,
        )
        #: Checkpoint layer of each KV-cache layer (KV-dtype plugins look up per-layer scales by it).
        self.kv_layer_ids = tuple(mla)
        #: layer index -> index into the KV cache (MLA) or the state pool (KDA)
        self._slot_of = {
            i: mla.index(i) if t == "mla" else dims.kda_layers.index(i) for i, t in enumerate(dims.layer_types)
        }
        self.ops = GlmOps(
            self.device,
            top_k=dims.top_k,
            n_group=dims.n_group,
            topk_group=dims.topk_group,
            norm_topk_prob=dims.norm_topk_prob,
            scaling=dims.routed_scaling_factor,
        )

    def __repr__(self) -> str:
        d = self.dims
        return (
            f"GlmKdaLM({len(d.kda_layers)} KDA + {len(d.mla_layers)} MLA layers, hidden={d.hidden_size}, "
            f"hc={d.hc_mult}, experts={d.n_routed_experts}/top{d.top_k}, dtype={self.dtype}, {self.ops})"
        )

    def lora_targets(self) -> LoRATargets:
        """The projections LoRA may wrap (every one but the head), by their paths from this model."""
        return self.weights.lora.under("weights")

    def make_state_pool(self, num_slots: int) -> KdaStatePool:
        return KdaStatePool.allocate(self.dims, num_slots, self.dtype, self.device)

    def commit_verify(self, state: KdaStatePool, slots, num_kept) -> None:
        """Roll each verify sequence's KDA state back to its first ``num_kept`` rows (see
        ``metrale_core.model_api``, "Optional extensions")."""
        conv_weights = [layer.attn.conv for layer in self.weights.layers if isinstance(layer.attn, KdaWeights)]
        rollback(state, conv_weights, list(slots), list(num_kept))

    @torch.no_grad()
    def forward(self, batch: ForwardBatch, kv: PagedKVCache | None, state: object | None = None) -> torch.Tensor:
        d = self.dims
        if not isinstance(state, KdaStatePool):
            raise ValueError("glm5_next keeps KDA state: forward needs the pool from make_state_pool")
        if d.mla_layers and (kv is None or len(kv.k) != len(d.mla_layers)):
            raise ValueError(f"glm5_next needs a paged KV cache with {len(d.mla_layers)} layers")
        state.verify = None  # a log not committed by now belongs to sequences that finished
        state.reset(batch.state_slots[batch.state_fresh])
        split, ctx = batch.split, batch.context_lens_host  # the scheduler's split, carried
        one_row = [SeqRows(i, r, r + 1, ctx[i]) for i, r in zip(split.one_row_seqs, split.one_row_rows, strict=True)]
        multi = [SeqRows(i, lo, hi, ctx[i]) for lo, hi, i in split.multi_row]
        x = F.embedding(batch.input_ids, self.weights.embed)
        streams = x.unsqueeze(1).expand(-1, d.hc_mult, -1).contiguous()
        selection: dict = {}
        for i, layer in enumerate(self.weights.layers):
            post, comb, h = hc_collapse(
                streams, layer.attn_hc, d.rms_norm_eps, d.hc_eps, d.hc_sinkhorn_iters, self.ops.sinkhorn
            )
            h = rms_norm(h, layer.input_norm, d.rms_norm_eps)
            slot = self._slot_of[i]
            if isinstance(layer.attn, MlaWeights):
                assert kv is not None, "GLM's MLA layers read and write the paged cache"
                y = mla_attention(
                    d, layer.attn, h, kv, slot, batch.slot_mapping, batch.block_tables, one_row, multi, selection
                )
            else:
                y = self._kda(h, layer.attn, state, slot, batch, one_row, multi)
            streams = hc_expand(y, post, comb, streams)
            post, comb, h = hc_collapse(
                streams, layer.ffn_hc, d.rms_norm_eps, d.hc_eps, d.hc_sinkhorn_iters, self.ops.sinkhorn
            )
            h = rms_norm(h, layer.post_norm, d.rms_norm_eps)
            if isinstance(layer.mlp, MlpWeights):
                y = mlp_forward(h, layer.mlp, d.swiglu_limit)
            else:
                y = moe_forward(h, layer.mlp, d.swiglu_limit, self.ops.route)
            streams = hc_expand(y, post, comb, streams)
        x = rms_norm(streams[batch.logits_rows].mean(dim=1), self.weights.norm, d.rms_norm_eps)
        return self.weights.lm_head(x).float()

    def _kda(
        self,
        x: torch.Tensor,
        w: KdaWeights,
        pool: KdaStatePool,
        j: int,
        batch: ForwardBatch,
        one_row: list[SeqRows],
        multi: list[SeqRows],
    ) -> torch.Tensor:
        d = self.dims
        rows, heads, hd, p = x.shape[0], d.linear_num_heads, d.linear_head_dim, d.linear_dim
        qkv = w.qkv(x)
        g = kda.forget_gate(w.f_b(w.f_a(x)), w.dt_bias, w.a_log, d.lower_bound)
        beta = torch.sigmoid(w.b_proj(x)).float()
        core = torch.empty(rows, heads, hd, dtype=torch.float32, device=x.device)
        rec, conv = pool.recurrent[j], pool.conv[j]
        verify = batch.verify_host or (False,) * batch.num_seqs
        decode = [s for s in one_row if not verify[s.index]]
        if decode:
            rows_d = torch.tensor([s.lo for s in decode], dtype=torch.int64, device=x.device)
            slots = batch.state_slots[[s.index for s in decode]] if len(decode) < batch.num_seqs else batch.state_slots
            mixed = self.ops.conv_update(qkv[rows_d], conv, w.conv, slots)
            q, k, v = mixed.view(-1, 3, heads, hd).unbind(1)
            core[rows_d] = self.ops.kda_decode(q, k, v, g[rows_d], beta[rows_d], rec, slots)
        for s in multi + [s for s in one_row if verify[s.index]]:
            n = s.hi - s.lo
            slot = int(batch.state_slots[s.index])
            if verify[s.index]:
                core[s.lo : s.hi] = consume_verify_chunk(
                    pool, j, slot, qkv[s.lo : s.hi], w.conv, g[s.lo : s.hi], beta[s.lo : s.hi], heads, hd
                )
                continue
            mixed, conv[slot] = kda.conv_prefill(qkv[s.lo : s.hi], conv[slot], w.conv)
            q, k, v = mixed.view(n, 3, heads, hd).unbind(1)
            q, k = kda.prepare_qk(q, k)
            if n >= CHUNK_MIN_ROWS:
                out, rec[slot] = kda.kda_chunked(q, k, v, g[s.lo : s.hi], beta[s.lo : s.hi], rec[slot])
            else:
                out, final = kda.kda_recurrent(
                    q[:, None], k[:, None], v[:, None], g[s.lo : s.hi, None], beta[s.lo : s.hi, None], rec[slot][None]
                )
                out, rec[slot] = out[:, 0], final[0]
            core[s.lo : s.hi] = out
        gate = w.g_b(w.g_a(x)).view(rows, heads, hd)
        o = kda.gated_rms_norm(core, gate, w.o_norm, d.rms_norm_eps, x.dtype)
        return w.o_proj(o.reshape(rows, p))
