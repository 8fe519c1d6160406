"""Multi-head latent attention in a decoder definition: its config (:class:`MlaDims`) and weights.

Owner: ``metrale_core.decoder``; ``dims.DecoderDims.from_config`` reads :class:`MlaDims` for an
``Attention(kind="mla")`` family, ``weights.load_weights`` calls :func:`load_mla` per layer; the
computation is ``metrale_core.layers.blocks.mla``.

Invariants:
- The config gives ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``
  and ``q_lora_rank`` (absent, null or 0: q is one projection, as DeepSeek-V2-Lite); a missing
  key is a ``ConfigError`` naming it, and so are ``attention_bias`` and ``rope_interleave: false``
  (not built: the rope dims rotate in adjacent pairs).
- The softmax scale is ``(n + r) ** -0.5``, times ``mscale(factor, mscale_all_dim) ** 2`` under a
  scaled RoPE whose parameters set ``mscale_all_dim`` (transformers' ``yarn_apply_mscale``).
- The latent's up-projection is read as HF's ``kv_b`` ``[H (n + v), R]`` (each head's key rows,
  then its value rows) where the store has it, else as llama.cpp's halves ``k_b`` ``[H, R, n]``
  and ``v_b`` ``[H, v, R]``; either way it is kept dense in the activation dtype (it is
  multiplied per head, ``einsum``), the other projections in the weight format.
- The latent norms use epsilon 1e-6 (transformers builds them without the config's).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from attrs import frozen

from metrale_core.decoder.names import Resolver
from metrale_core.errors import ConfigError
from metrale_core.layers.blocks.mla import MlaShape, MlaWeights
from metrale_core.layers.formats.linear import Linear

__all__ = ["LATENT_EPS", "MlaDims", "load_mla"]

#: Epsilon of the q / kv latent RMSNorms (transformers' ``DeepseekV2RMSNorm`` default).
LATENT_EPS = 1e-6


def _mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@frozen
class MlaDims:
    """The latent attention of a decoder, read from its config."""

    shape: MlaShape
    #: ``q_lora_rank`` (0: q is one projection).
    q_rank: int
    #: The softmax scale.
    scale: float

    @property
    def qk_head_dim(self) -> int:
        return self.shape.nope + self.shape.rope

    @classmethod
    def from_config(cls, config: Mapping[str, Any], name: str, heads: int, rope_scaling: dict | None) -> MlaDims:
        def need(key: str) -> int:
            value = config.get(key)
            if not value:
                raise ConfigError(f"{name}: a latent-attention config needs {key!r}")
            return int(value)

        if config.get("attention_bias"):
            raise ConfigError(f"{name}: attention_bias with latent attention is not built")
        if config.get("rope_interleave") is False:
            raise ConfigError(f"{name}: rope_interleave false (rotate-half rope keys) is not built")
        shape = MlaShape(
            heads,
            need("kv_lora_rank"),
            need("qk_nope_head_dim"),
            need("qk_rope_head_dim"),
            need("v_head_dim"),
        )
        if shape.rope % 2:
            raise ConfigError(f"{name}: qk_rope_head_dim {shape.rope} is odd")
        scale = (shape.nope + shape.rope) ** -0.5
        scaling = rope_scaling or {}
        if scaling.get("mscale_all_dim"):
            factor = float(scaling.get("factor") or 1.0)
            scale *= _mscale(factor, float(scaling["mscale_all_dim"])) ** 2
        return cls(shape, int(config.get("q_lora_rank") or 0), scale)


#: ``(slots, layer, shapes, bias, at) -> Linear`` and ``(slot, layer, shape) -> tensor``: the
#: decoder's projection builder (``at``: its path in the layer's record, declared for LoRA) and
#: tensor reader (``weights.load_weights``).
Build = Callable[[list[str], int, list[tuple[int, int]], Any, tuple[str, ...]], Linear]
Get = Callable[[str, int, tuple[int, ...]], torch.Tensor]


def load_mla(mla: MlaDims, hidden: int, layer: int, store: Any, n: Resolver, linear: Build, get: Get) -> MlaWeights:
    """Layer ``layer``'s latent-attention weights (without ``o_proj``, the layer's own)."""
    s, i, D = mla.shape, layer, hidden
    q_out = s.heads * (s.nope + s.rope)
    q = q_a = q_a_norm = q_b = None
    if mla.q_rank:
        q_a = linear(["q_a"], i, [(mla.q_rank, D)], None, ("mla", "q_a"))
        q_a_norm = get("q_a_norm", i, (mla.q_rank,))
        q_b = linear(["q_b"], i, [(q_out, mla.q_rank)], None, ("mla", "q_b"))
    else:
        q = linear(["q"], i, [(q_out, D)], None, ("mla", "q"))
    if n("kv_b", i, "weight") in store:
        kv_b = get("kv_b", i, (s.heads * (s.nope + s.value), s.latent)).view(s.heads, s.nope + s.value, s.latent)
        w_uk, w_uv = kv_b.split([s.nope, s.value], dim=1)
    else:
        w_uk = get("k_b", i, (s.heads, s.latent, s.nope)).transpose(1, 2)
        w_uv = get("v_b", i, (s.heads, s.value, s.latent))
    return MlaWeights(
        q=q,
        q_a=q_a,
        q_a_norm=q_a_norm,
        q_b=q_b,
        kv_a=linear(["kv_a"], i, [(s.latent + s.rope, D)], None, ("mla", "kv_a")),
        kv_a_norm=get("kv_a_norm", i, (s.latent,)),
        w_uk=w_uk.contiguous(),
        w_uv=w_uv.contiguous(),
    )
