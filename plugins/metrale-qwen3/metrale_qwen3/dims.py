"""Checkpoint config -> decoder dimensions, for the Llama / Qwen2 / Qwen3 family.

Owner: ``metrale_qwen3``; :func:`ModelDims.from_config` is read once per load (``loader.py``).

Invariants:
- Llama, Qwen2 and Qwen3 share one layer code; :class:`ArchVariant` records what differs
  (QK-norm, which projections carry a bias).
- A config this family cannot run (another activation, sliding windows, an invalid GQA layout,
  a missing key) is a ``ConfigError`` naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attrs import frozen

from metrale_core.api import ConfigError

__all__ = ["VARIANTS", "ArchVariant", "ModelDims"]


@frozen
class ArchVariant:
    """What distinguishes one member of the family."""

    #: Registered loader name and ``ModelInfo.architecture``.
    name: str
    #: Per-head RMSNorm of q and k before RoPE (Qwen3).
    qk_norm: bool
    #: q/k/v carry a bias regardless of the config (Qwen2).
    qkv_bias_always: bool = False
    #: ``attention_bias`` in the config also puts a bias on o_proj (Llama, Qwen3).
    o_bias_follows_config: bool = True


VARIANTS: dict[str, ArchVariant] = {
    "qwen3": ArchVariant("qwen3", qk_norm=True),
    "llama": ArchVariant("llama", qk_norm=False),
    "qwen2": ArchVariant("qwen2", qk_norm=False, qkv_bias_always=True, o_bias_follows_config=False),
}


def _require(config: Mapping[str, Any], key: str) -> Any:
    value = config.get(key)
    if value is None:
        raise ConfigError(f"model config lacks {key!r}")
    return value


def _rope(config: Mapping[str, Any]) -> tuple[float, dict | None]:
    params = config.get("rope_parameters") or {}
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    scaling = dict(config.get("rope_scaling") or params)
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    return float(theta), (None if kind == "default" else scaling)


@frozen
class ModelDims:
    """Dimensions and switches of one decoder, read from its config."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position: int
    tie_word_embeddings: bool
    qk_norm: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_config(cls, config: Mapping[str, Any], variant: ArchVariant) -> ModelDims:
        act = config.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"hidden_act {act!r} is not supported by the {variant.name} loader (only silu)")
        if config.get("use_sliding_window"):
            raise ConfigError(f"{variant.name}: sliding-window attention is not supported")
        hidden = int(_require(config, "hidden_size"))
        heads = int(_require(config, "num_attention_heads"))
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        if heads % kv_heads or head_dim % 2:
            raise ConfigError(
                f"{variant.name}: {heads} heads / {kv_heads} KV heads / head_dim {head_dim} is not a valid GQA layout"
            )
        theta, scaling = _rope(config)
        attention_bias = bool(config.get("attention_bias", False))
        eos = config.get("eos_token_id")
        eos_ids = () if eos is None else tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
        return cls(
            vocab_size=int(_require(config, "vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(_require(config, "intermediate_size")),
            num_layers=int(_require(config, "num_hidden_layers")),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position=int(config.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qk_norm=variant.qk_norm,
            qkv_bias=variant.qkv_bias_always or attention_bias,
            o_bias=attention_bias and variant.o_bias_follows_config,
            mlp_bias=bool(config.get("mlp_bias", False)),
            eos_token_ids=eos_ids,
        )
