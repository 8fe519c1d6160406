"""Weight loading for GLM-5.3 through the ``WeightStore``, into per-layer records.

Owner: ``metrale_glm_kda``; the loader factory calls :func:`load_weights`.

Invariants:
- Names are the checkpoint's (``q_conv1d``, ``f_a_proj``, ``hc_attn_fn``, ``experts.{e}.gate_proj``,
  ...), under ``model.language_model.`` (composite checkpoints) or ``model.``; transformers'
  runtime names (``conv1d``, ``forget_gate.*``, ``attn_hc.*``, stacked ``experts.gate_up_proj``)
  are accepted too.  Every tensor is read with the shape the config implies, so a wrong
  checkpoint fails with ``ShapeMismatch`` naming it.
- Tensors transformers keeps in float32 stay float32 here whatever the model dtype: conv
  weights, ``dt_bias``, ``A_log``, the router and its correction bias, the mHC parameters.
- Fused at load time: KDA ``qkv = [q; k; v]``, MLP ``gate_up = [gate; up]``, MLA ``kv_b`` split
  into ``W_uk`` / ``W_uv`` per head for the absorbed attention.
- The weight format (``--weight-format``) is the shared linear layer's: every 2-D projection
  applied as ``y = x @ W.T`` (KDA's seven, MLA's ``q_a`` / ``q_b`` / ``kv_a`` / ``o_proj``, the
  dense and shared-expert MLPs, the LM head) is built by ``build_linear``.  Tensors that are not
  such a projection stay in the model dtype in every format: the routed experts (stacked
  ``[E, ..]``, gathered per expert), ``W_uk`` / ``W_uv`` (absorbed into einsums), the indexer
  (its scores pick the attended tokens), the router, norms and the mHC parameters.
- Every projection but the head is declared for LoRA as it is built (``GlmWeights.lora``): its
  path in the record (``layers.{i}.attn.qkv``, ``layers.{i}.mlp.shared.down`` ...) and the
  checkpoint module paths it fuses.
"""

from __future__ import annotations

from typing import Any

import torch
from attrs import field, frozen

from metrale_core.api import Linear, LoRATarget, LoRATargets, WeightsError, build_linear
from metrale_glm_kda.config import GlmDims
from metrale_glm_kda.hc import HcWeights
from metrale_glm_kda.mla import IndexerWeights, MlaWeights
from metrale_glm_kda.moe import MlpWeights, MoeWeights

__all__ = ["GlmWeights", "KdaWeights", "LayerWeights", "load_weights"]


@frozen
class KdaWeights:
    qkv: Linear  # [3P, D]
    conv: torch.Tensor  # [3P, W] float32
    f_a: Linear  # [K, D]
    f_b: Linear  # [P, K]
    dt_bias: torch.Tensor  # [P] float32
    a_log: torch.Tensor  # [H] float32
    b_proj: Linear  # [H, D]
    g_a: Linear  # [V, D]
    g_b: Linear  # [P, V]
    o_norm: torch.Tensor  # [V]
    o_proj: Linear  # [D, P]


@frozen
class LayerWeights:
    attn_hc: HcWeights
    ffn_hc: HcWeights
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    #: ``KdaWeights`` for a linear-attention layer, ``MlaWeights`` for a DSA layer.
    attn: KdaWeights | MlaWeights
    #: ``MlpWeights`` (dense) or ``MoeWeights`` (sparse).
    mlp: MlpWeights | MoeWeights


@frozen
class GlmWeights:
    embed: torch.Tensor
    layers: tuple[LayerWeights, ...]
    norm: torch.Tensor
    lm_head: Linear
    #: The weight format of the projections (``exact`` unless ``--weight-format`` asked for another).
    weight_format: str = "exact"
    #: The projections LoRA may wrap, by their paths in this record.
    lora: LoRATargets = field(factory=LoRATargets)


class _Reader:
    def __init__(self, store: Any, dtype: torch.dtype, device: torch.device | str, weight_format: str) -> None:
        self.store, self.dtype, self.device, self.weight_format = store, dtype, device, weight_format
        #: The LoRA targets declared so far (``linear(..., at=)``).
        self.lora: list[LoRATarget] = []

    def name(self, names: str | tuple[str, ...]) -> str:
        """The first of ``names`` the checkpoint holds."""
        names = (names,) if isinstance(names, str) else names
        for name in names:
            if name in self.store:
                return name
        raise WeightsError(
            f"checkpoint lacks tensor {names[0]!r}"
            + (f" (also tried {', '.join(names[1:])})" if len(names) > 1 else "")
        )

    def get(self, names: str | tuple[str, ...], shape: tuple[int, ...], fp32: bool = False) -> torch.Tensor:
        name = self.name(names)
        t = self.store.get(name, dtype=torch.float32 if fp32 else self.dtype)
        if t.numel() == torch.Size(shape).numel() and tuple(t.shape) != shape:
            t = t.reshape(shape)  # e.g. A_log [1, 1, H, 1] or conv [C, 1, W]
        if tuple(t.shape) != shape:
            self.store.get(name, dtype=t.dtype, shape=shape)  # raises ShapeMismatch naming it
        return t.to(self.device)

    def linear(
        self,
        parts: list[str | tuple[str, ...]],
        shapes: list[tuple[int, int]],
        dense: torch.Tensor | None = None,
        *,
        at: tuple[str | int, ...] | None = None,
        output_head: bool = False,
    ) -> Linear:
        """The projection stacking ``parts`` (each a name or its alternatives) in the weight format,
        declared for LoRA at path ``at`` in the weights record (None: not declared)."""
        names = [self.name(p) for p in parts]
        if at is not None:
            self.lora.append(LoRATarget.of(at, names, shapes))
        return build_linear(
            self.store,
            names,
            shapes,
            self.weight_format,
            self.dtype,
            self.device,
            None,
            dense,
            output_head=output_head,
        )


def _hc(r: _Reader, p: str, which: str, dims: GlmDims) -> HcWeights:
    hc, width = dims.hc_mult, (2 + dims.hc_mult) * dims.hc_mult
    return HcWeights(
        fn=r.get((f"{p}hc_{which}_fn", f"{p}{which}_hc.fn"), (width, hc * dims.hidden_size), True),
        base=r.get((f"{p}hc_{which}_base", f"{p}{which}_hc.base"), (width,), True),
        scale=r.get((f"{p}hc_{which}_scale", f"{p}{which}_hc.scale"), (3,), True),
    )


def _kda(r: _Reader, a: str, dims: GlmDims, at: tuple[str | int, ...]) -> KdaWeights:
    D, H, K, P, W = dims.hidden_size, dims.linear_num_heads, dims.linear_head_dim, dims.linear_dim, dims.conv_kernel
    qkv = r.linear([a + f"{x}_proj.weight" for x in "qkv"], [(P, D)] * 3, at=(*at, "qkv"))
    if a + "q_conv1d.weight" in r.store:
        conv = torch.cat([r.get(a + f"{x}_conv1d.weight", (P, W), True) for x in "qkv"])
    else:
        conv = r.get(a + "conv1d.weight", (3 * P, W), True)
    fg = a + "forget_gate."
    return KdaWeights(
        qkv=qkv,
        conv=conv,
        f_a=r.linear([(a + "f_a_proj.weight", fg + "f_a_proj.weight")], [(K, D)], at=(*at, "f_a")),
        f_b=r.linear([(a + "f_b_proj.weight", fg + "f_b_proj.weight")], [(P, K)], at=(*at, "f_b")),
        dt_bias=r.get((a + "dt_bias", fg + "dt_bias"), (P,), True),
        a_log=r.get((a + "A_log", fg + "A_log"), (H,), True),
        b_proj=r.linear([a + "b_proj.weight"], [(H, D)], at=(*at, "b_proj")),
        g_a=r.linear([a + "g_a_proj.weight"], [(K, D)], at=(*at, "g_a")),
        g_b=r.linear([a + "g_b_proj.weight"], [(P, K)], at=(*at, "g_b")),
        o_norm=r.get(a + "o_norm.weight", (K,)),
        o_proj=r.linear([a + "o_proj.weight"], [(D, P)], at=(*at, "o_proj")),
    )


def _mla(r: _Reader, a: str, dims: GlmDims, full_indexer: bool, at: tuple[str | int, ...]) -> MlaWeights:
    D, H, Rq, R = dims.hidden_size, dims.num_heads, dims.q_lora_rank, dims.kv_lora_rank
    nope, v = dims.qk_nope_head_dim, dims.v_head_dim
    kv_b = r.get(a + "kv_b_proj.weight", (H * (nope + v), R)).view(H, nope + v, R)
    indexer = None
    if full_indexer:
        i, d, nh = a + "indexer.", dims.index_head_dim, dims.index_n_heads
        indexer = IndexerWeights(
            wq_b=r.get(i + "wq_b.weight", (nh * d, Rq)),
            wk=r.get(i + "wk.weight", (d, D)),
            k_norm_weight=r.get(i + "k_norm.weight", (d,)),
            k_norm_bias=r.get(i + "k_norm.bias", (d,)),
            weights_proj=r.get(i + "weights_proj.weight", (nh, D)),
            ape=r.get(i + "index_kpool_compress_ape", (dims.index_kpool, d)),
            gate=r.get(i + "index_kpool_compress_gate", (d, D)),
        )
    return MlaWeights(
        q_a=r.linear([a + "q_a_proj.weight"], [(Rq, D)], at=(*at, "q_a")),
        q_a_norm=r.get(a + "q_a_layernorm.weight", (Rq,)),
        q_b=r.linear([a + "q_b_proj.weight"], [(H * nope, Rq)], at=(*at, "q_b")),
        kv_a=r.linear([a + "kv_a_proj_with_mqa.weight"], [(R, D)], at=(*at, "kv_a")),
        kv_a_norm=r.get(a + "kv_a_layernorm.weight", (R,)),
        w_uk=kv_b[:, :nope].contiguous(),
        w_uv=kv_b[:, nope:].contiguous(),
        o_proj=r.linear([a + "o_proj.weight"], [(D, H * v)], at=(*at, "o_proj")),
        indexer=indexer,
    )


def _mlp(r: _Reader, m: str, dims: GlmDims, inter: int, at: tuple[str | int, ...]) -> MlpWeights:
    D = dims.hidden_size
    gate_up: list[str | tuple[str, ...]] = [m + "gate_proj.weight", m + "up_proj.weight"]
    return MlpWeights(
        gate_up=r.linear(gate_up, [(inter, D), (inter, D)], at=(*at, "gate_up")),
        down=r.linear([m + "down_proj.weight"], [(D, inter)], at=(*at, "down")),
    )


def _moe(r: _Reader, m: str, dims: GlmDims, at: tuple[str | int, ...]) -> MoeWeights:
    D, E, inter = dims.hidden_size, dims.n_routed_experts, dims.moe_intermediate_size
    e = m + "experts."
    if e + "gate_up_proj" in r.store:
        gate_up = r.get(e + "gate_up_proj", (E, 2 * inter, D))
        down = r.get(e + "down_proj", (E, D, inter))
    else:
        gate_up = torch.stack(
            [
                torch.cat([r.get(f"{e}{j}.gate_proj.weight", (inter, D)), r.get(f"{e}{j}.up_proj.weight", (inter, D))])
                for j in range(E)
            ]
        )
        down = torch.stack([r.get(f"{e}{j}.down_proj.weight", (D, inter)) for j in range(E)])
    return MoeWeights(
        router=r.get(m + "gate.weight", (E, D), True),
        bias=r.get(m + "gate.e_score_correction_bias", (E,), True),
        gate_up=gate_up,
        down=down,
        shared=_mlp(r, m + "shared_experts.", dims, inter * dims.n_shared_experts, (*at, "shared")),
    )


def load_weights(
    store: Any, dims: GlmDims, dtype: torch.dtype, device: torch.device | str, weight_format: str = "exact"
) -> GlmWeights:
    """Read, check and fuse every tensor of the text decoder, projections in ``weight_format``."""
    r = _Reader(store, dtype, device, weight_format)
    root = "model.language_model." if "model.language_model.embed_tokens.weight" in store else "model."
    D = dims.hidden_size
    layers = []
    for i in range(dims.num_layers):
        p = f"{root}layers.{i}."
        attn: KdaWeights | MlaWeights
        if dims.layer_types[i] == "kda":
            attn = _kda(r, p + "self_attn.", dims, ("layers", i, "attn"))
        else:
            attn = _mla(r, p + "self_attn.", dims, dims.indexer_types[i] == "full", ("layers", i, "attn"))
        mlp = (
            _moe(r, p + "mlp.", dims, ("layers", i, "mlp"))
            if dims.mlp_types[i] == "sparse"
            else _mlp(r, p + "mlp.", dims, dims.intermediate_size, ("layers", i, "mlp"))
        )
        layers.append(
            LayerWeights(
                attn_hc=_hc(r, p, "attn", dims),
                ffn_hc=_hc(r, p, "ffn", dims),
                input_norm=r.get(p + "input_layernorm.weight", (D,)),
                post_norm=r.get(p + "post_attention_layernorm.weight", (D,)),
                attn=attn,
                mlp=mlp,
            )
        )
    embed = r.get(root + "embed_tokens.weight", (dims.vocab_size, D))
    tied = dims.tie_word_embeddings or "lm_head.weight" not in store
    head_name = root + "embed_tokens.weight" if tied else "lm_head.weight"
    lm_head = r.linear([head_name], [(dims.vocab_size, D)], embed if tied else None, output_head=True)
    return GlmWeights(
        embed=embed,
        layers=tuple(layers),
        norm=r.get(root + "norm.weight", (D,)),
        lm_head=lm_head,
        weight_format=weight_format,
        lora=LoRATargets(tuple(r.lora)),
    )
