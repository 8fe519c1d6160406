"""Checkpoint config -> the dimensions of one decoder of a family (:class:`DecoderDims`).

Owner: ``metrale_core.decoder``; :meth:`DecoderDims.from_config` is read once per load
(``build.build_decoder``).

Invariants:
- A config the definition cannot run (another activation, sliding windows where the family
  builds none, an invalid GQA layout, a missing key, a RoPE kind not built) is a ``ConfigError``
  naming the family and the key; so is a definition that declares what is not built yet
  (``DecoderSpec.unbuilt``).
- Biases follow the recipe: ``attention.qkv_bias`` / ``o_bias`` = ``config`` read
  ``attention_bias``; ``mlp.bias`` = ``config`` reads ``mlp_bias``.
- RoPE: ``rope_parameters`` (transformers >= 5) or ``rope_theta`` / ``rope_scaling``; the kind
  ``default`` leaves ``rope_scaling`` None.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attrs import frozen

from metrale_core.decoder.spec import ROPE_KINDS, ROPE_KINDS_BUILT, DecoderSpec
from metrale_core.errors import ConfigError

__all__ = ["DecoderDims"]


def _require(config: Mapping[str, Any], key: str) -> Any:
    value = config.get(key)
    if value is None:
        raise ConfigError(f"model config lacks {key!r}")
    return value


def _rope(config: Mapping[str, Any], family: str) -> tuple[float, dict | None]:
    params = config.get("rope_parameters") or {}
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    scaling = dict(config.get("rope_scaling") or params)
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind in ROPE_KINDS and kind not in ROPE_KINDS_BUILT:
        raise ConfigError(f"{family}: rope type {kind!r} is declared but not built yet (built: {ROPE_KINDS_BUILT})")
    return float(theta), (None if kind == "default" else scaling)


@frozen
class DecoderDims:
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
    qk_norm: str
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_config(cls, config: Mapping[str, Any], spec: DecoderSpec) -> DecoderDims:
        name = spec.name
        unbuilt = spec.unbuilt()
        if unbuilt:
            raise ConfigError(f"{name}: the definition declares {', '.join(unbuilt)}, not built yet")
        act = config.get("hidden_act", spec.activations[0])
        if act not in spec.activations:
            raise ConfigError(
                f"hidden_act {act!r} is not supported by the {name} loader (only {'/'.join(spec.activations)})"
            )
        if config.get("use_sliding_window"):
            raise ConfigError(f"{name}: sliding-window attention is not supported")
        hidden = int(_require(config, "hidden_size"))
        heads = int(_require(config, "num_attention_heads"))
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        if heads % kv_heads or head_dim % 2:
            raise ConfigError(
                f"{name}: {heads} heads / {kv_heads} KV heads / head_dim {head_dim} is not a valid GQA layout"
            )
        theta, scaling = _rope(config, name)
        attention_bias = bool(config.get("attention_bias", False))
        eos = config.get("eos_token_id")
        eos_ids = () if eos is None else tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
        attn = spec.attention
        return cls(
            vocab_size=int(_require(config, "vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(_require(config, "intermediate_size")),
            num_layers=int(_require(config, "num_hidden_layers")),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(config.get("rms_norm_eps", spec.default_eps)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position=int(config.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qk_norm=attn.qk_norm,
            qkv_bias=attn.qkv_bias == "always" or (attn.qkv_bias == "config" and attention_bias),
            o_bias=attn.o_bias == "config" and attention_bias,
            mlp_bias=spec.mlp.bias == "config" and bool(config.get("mlp_bias", False)),
            eos_token_ids=eos_ids,
        )
