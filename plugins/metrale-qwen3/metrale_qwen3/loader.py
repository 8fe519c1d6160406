"""Checkpoint config -> model dimensions, and weight loading through the ``WeightStore``.

Owner: ``metrale_qwen3``; the factories registered in ``__init__.py`` call :func:`load_model`.

Invariants:
- Weights are read only through ``store.get(name, dtype=, shape=)`` with the shape the config
  implies, so a wrong checkpoint fails with ``ShapeMismatch`` naming the tensor.
- Llama, Qwen2 and Qwen3 share one layer code; :class:`ArchVariant` records what differs
  (QK-norm, which projections carry a bias).
- The output head is tied to the embedding when the config says so or the checkpoint has no
  ``lm_head.weight``.
- Projections are fused at load time: ``qkv = [q; k; v]`` and ``gate_up = [gate; up]``, and kept
  in the weight format ``linear.resolve_weight_format(options)`` names (``exact`` by default:
  dense tensors, bit-identical to the dequantized checkpoint).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from attrs import frozen

from metrale_core.components import LoadOptions
from metrale_core.errors import ConfigError

from metrale_qwen3.linear import Linear, build_linear, resolve_weight_format

__all__ = ["VARIANTS", "ArchVariant", "DecoderWeights", "LayerWeights", "ModelDims", "load_llama",
           "load_model", "load_qwen2", "load_qwen3", "load_weights", "torch_dtype"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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


def torch_dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise ConfigError(f"dtype {name!r} is not supported; use one of {sorted(_DTYPES)}") from None


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
    def from_config(cls, config: Mapping[str, Any], variant: ArchVariant) -> "ModelDims":
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
            raise ConfigError(f"{variant.name}: {heads} heads / {kv_heads} KV heads / head_dim "
                              f"{head_dim} is not a valid GQA layout")
        theta, scaling = _rope(config)
        attention_bias = bool(config.get("attention_bias", False))
        eos = config.get("eos_token_id")
        eos_ids = () if eos is None else tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
        return cls(
            vocab_size=int(_require(config, "vocab_size")), hidden_size=hidden,
            intermediate_size=int(_require(config, "intermediate_size")),
            num_layers=int(_require(config, "num_hidden_layers")), num_heads=heads,
            num_kv_heads=kv_heads, head_dim=head_dim,
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)), rope_theta=theta,
            rope_scaling=scaling, max_position=int(config.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qk_norm=variant.qk_norm, qkv_bias=variant.qkv_bias_always or attention_bias,
            o_bias=attention_bias and variant.o_bias_follows_config,
            mlp_bias=bool(config.get("mlp_bias", False)), eos_token_ids=eos_ids)


@frozen
class LayerWeights:
    """One decoder layer's tensors; projections are fused ``Linear`` objects (biases inside them)."""

    input_norm: torch.Tensor
    qkv: Linear
    o_proj: Linear
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: Linear
    down: Linear

    @property
    def qkv_bias(self) -> torch.Tensor | None:
        return self.qkv.bias

    @property
    def o_bias(self) -> torch.Tensor | None:
        return self.o_proj.bias


@frozen
class DecoderWeights:
    embed: torch.Tensor
    layers: tuple[LayerWeights, ...]
    norm: torch.Tensor
    #: The dense output matrix (the embedding itself when tied); None when only ``head`` keeps it.
    lm_head: torch.Tensor | None
    #: The output head as the forward runs it.
    head: Linear
    #: The weight format the projections are kept in (``linear.WEIGHT_FORMATS``).
    weight_format: str = "exact"


def load_weights(store: Any, dims: ModelDims, dtype: torch.dtype,
                 device: torch.device | str, weight_format: str = "exact") -> DecoderWeights:
    """Read, check and fuse every tensor the decoder needs, projections in ``weight_format``."""

    def get(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        return store.get(name, dtype=dtype, shape=shape).to(device)

    def maybe(name: str, shape: tuple[int, ...], present: bool) -> torch.Tensor | None:
        return get(name, shape) if present else None

    def linear(names: list[str], shapes: list[tuple[int, int]], bias: torch.Tensor | None) -> Linear:
        return build_linear(store, names, shapes, weight_format, dtype, device, bias)

    D, I, d = dims.hidden_size, dims.intermediate_size, dims.head_dim
    q_out, kv_out = dims.num_heads * d, dims.num_kv_heads * d
    layers = []
    for i in range(dims.num_layers):
        p = f"model.layers.{i}."
        a, m = p + "self_attn.", p + "mlp."
        qkv_bias = None
        if dims.qkv_bias:
            qkv_bias = torch.cat([get(a + "q_proj.bias", (q_out,)), get(a + "k_proj.bias", (kv_out,)),
                                  get(a + "v_proj.bias", (kv_out,))])
        qkv = linear([a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"],
                     [(q_out, D), (kv_out, D), (kv_out, D)], qkv_bias)
        gate_up_bias = None
        if dims.mlp_bias:
            gate_up_bias = torch.cat([get(m + "gate_proj.bias", (I,)), get(m + "up_proj.bias", (I,))])
        gate_up = linear([m + "gate_proj.weight", m + "up_proj.weight"], [(I, D), (I, D)], gate_up_bias)
        layers.append(LayerWeights(
            input_norm=get(p + "input_layernorm.weight", (D,)), qkv=qkv,
            o_proj=linear([a + "o_proj.weight"], [(D, q_out)], maybe(a + "o_proj.bias", (D,), dims.o_bias)),
            q_norm=maybe(a + "q_norm.weight", (d,), dims.qk_norm),
            k_norm=maybe(a + "k_norm.weight", (d,), dims.qk_norm),
            post_norm=get(p + "post_attention_layernorm.weight", (D,)), gate_up=gate_up,
            down=linear([m + "down_proj.weight"], [(D, I)], maybe(m + "down_proj.bias", (D,), dims.mlp_bias))))
    embed = get("model.embed_tokens.weight", (dims.vocab_size, D))
    tied = dims.tie_word_embeddings or "lm_head.weight" not in store
    head_name = "model.embed_tokens.weight" if tied else "lm_head.weight"
    if tied or weight_format == "exact":
        lm_head = embed if tied else get("lm_head.weight", (dims.vocab_size, D))
        head = build_linear(store, [head_name], [(dims.vocab_size, D)], weight_format, dtype, device,
                            dense=lm_head, output_head=True)
    else:
        lm_head = None
        head = build_linear(store, [head_name], [(dims.vocab_size, D)], weight_format, dtype, device,
                            output_head=True)
    return DecoderWeights(embed=embed, layers=tuple(layers), norm=get("model.norm.weight", (D,)),
                          lm_head=lm_head, head=head, weight_format=weight_format)


def load_model(store: Any, options: LoadOptions, variant: ArchVariant):
    """Build a :class:`~metrale_qwen3.model.DecoderLM` from ``store`` (the loader factories)."""
    from metrale_qwen3.model import DecoderLM

    dims = ModelDims.from_config(store.config, variant)
    dtype = torch_dtype(options.dtype)
    weights = load_weights(store, dims, dtype, options.device, resolve_weight_format(options))
    return DecoderLM(dims, weights, architecture=variant.name, dtype=dtype, device=options.device)


def load_qwen3(store: Any, options: LoadOptions):
    """Factory of the ``qwen3`` loader."""
    return load_model(store, options, VARIANTS["qwen3"])


def load_llama(store: Any, options: LoadOptions):
    """Factory of the ``llama`` loader."""
    return load_model(store, options, VARIANTS["llama"])


def load_qwen2(store: Any, options: LoadOptions):
    """Factory of the ``qwen2`` loader."""
    return load_model(store, options, VARIANTS["qwen2"])
