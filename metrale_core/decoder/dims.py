"""Checkpoint config -> the dimensions of one decoder of a family (:class:`DecoderDims`).

Owner: ``metrale_core.decoder``; :meth:`DecoderDims.from_config` is read once per load
(``build.build_decoder``).

Invariants:
- A config the definition cannot run (another activation, sliding windows where the family
  builds none, an invalid GQA layout, a missing key, a RoPE kind not built) is a ``ConfigError``
  naming the family and the key; so is a definition that declares what is not built yet
  (``DecoderSpec.unbuilt``).
- Per-layer windows and NoPE layers, and the scalars' values, are ``pattern``'s reading; the
  activation is the config's ``hidden_activation`` (Gemma) or ``hidden_act``.
- ``unit_offset`` is the recipe's ``(1 + w)`` norm, off for a GGUF (llama.cpp's converter stores
  ``1 + w``).  ``rotary_dim`` is ``head_dim * partial_rotary_factor`` (top level or in the RoPE
  parameters), even.
- Biases follow the recipe: ``attention.qkv_bias`` / ``o_bias`` = ``config`` read
  ``attention_bias``; ``mlp.bias`` = ``config`` reads ``mlp_bias`` (``always``: biases on every
  MLP projection, an MoE's router and experts too).
- An MoE definition reads its experts with ``moe_dims.MoeDims``; ``intermediate_size`` (the dense
  MLP's width) is required only when some layer is dense.
- A latent-attention definition (``Attention(kind="mla")``) reads ``mla.MlaDims``: then
  ``head_dim`` and ``rotary_dim`` are ``qk_rope_head_dim`` (the RoPE tables' width), every head
  is its own KV head (a llama.cpp file's ``head_count_kv`` 1 is its MQA view of the latent), and
  the softmax scale is ``MlaDims.scale``.
- A safetensors checkpoint whose ``quantization_config`` says ``mxfp4`` (gpt-oss's ``*_blocks`` /
  ``*_scales`` experts) is read where the definition has experts (``weights.load_weights`` serves
  them as GGUF MXFP4 blocks); one without experts is refused.
- RoPE: ``rope_parameters`` (transformers >= 5) or ``rope_theta`` / ``rope_scaling``; the kind
  ``default`` leaves ``rope_scaling`` None; a kind outside ``spec.ROPE_KINDS_BUILT`` is refused.
  The sliding layers rotate with their own base
  (``local_theta``, unscaled) where the recipe says so (``LayerPattern.sliding_rope_theta``), or
  with their own parameters where the config's ``rope_parameters`` are per layer type
  (``full_attention`` / ``sliding_attention``, each without its ``rope_theta`` in the scaling).
- A config nesting the text decoder under ``text_config`` (a multimodal checkpoint) is read from
  there, the outer ``eos_token_id`` where the inner has none; ``use_bidirectional_attention`` (an
  embedding model) is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attrs import frozen

from metrale_core.decoder.mla import MlaDims
from metrale_core.decoder.moe_dims import MoeDims
from metrale_core.decoder.pattern import layer_ropes, layer_sliding, layer_windows, scalar
from metrale_core.decoder.spec import ROPE_KINDS_BUILT, DecoderSpec
from metrale_core.errors import ConfigError

__all__ = ["DecoderDims"]

#: The sliding layers' RoPE base where the recipe gives them one and the config names none
#: (transformers' Gemma 3 default, and llama.cpp's for its gemma3 files).
_LOCAL_THETA = 10_000.0


def _require(config: Mapping[str, Any], key: str) -> Any:
    value = config.get(key)
    if value is None:
        raise ConfigError(f"model config lacks {key!r}")
    return value


def _scaling(params: Mapping[str, Any], family: str) -> dict | None:
    """RoPE parameters -> the scaling the layers take (None: the kind ``default``)."""
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_KINDS_BUILT:
        raise ConfigError(f"{family}: rope type {kind!r} is not built (built: {', '.join(ROPE_KINDS_BUILT)})")
    return None if kind == "default" else dict(params)


def _rope(config: Mapping[str, Any], spec: DecoderSpec) -> tuple[float, dict | None, float | None, dict | None]:
    """``(theta, scaling)`` of the global layers and of the sliding ones (None, None: the same)."""
    family = spec.name
    params = config.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:  # transformers >= 5, per layer type
        full, local = params.get("full_attention") or {}, params.get("sliding_attention")
        bare = lambda p: {k: v for k, v in p.items() if k != "rope_theta"}
        theta = float(full.get("rope_theta", config.get("rope_theta", 10000.0)))
        if local is None:
            return theta, _scaling(bare(full), family), None, None
        local_theta = float(local.get("rope_theta", config.get("rope_local_base_freq", _LOCAL_THETA)))
        return theta, _scaling(bare(full), family), local_theta, _scaling(bare(local), family)
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    scaling = _scaling(dict(config.get("rope_scaling") or params), family)
    if spec.layers.sliding_rope_theta is None:
        return float(theta), scaling, None, None
    local = scalar(config, spec.layers.sliding_rope_theta, family)
    return float(theta), scaling, _LOCAL_THETA if local is None else local, None


def _on(config: Mapping[str, Any], value: Any, family: str, field: str) -> float:
    """A scalar the recipe needs (``field``): its value, or a ``ConfigError`` when the config lacks it."""
    number = scalar(config, value, family)
    if number is None:
        raise ConfigError(f"{family}: {field} reads {value!r}, which the model config lacks")
    return number


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
    #: Per layer: its attention window (None: the whole context) and whether it has RoPE.
    windows: tuple[int | None, ...] = ()
    ropes: tuple[bool, ...] = ()
    #: The softmax scale and the attention-logit soft-cap (None: none).
    attn_scale: float = 0.0
    attn_softcap: float | None = None
    #: The stream's scalars (``spec.Scalars``; None: off).
    embedding_scale: float | None = None
    residual_scale: float | None = None
    logits_divisor: float | None = None
    final_softcap: float | None = None
    #: Norms run as ``(1 + w)`` (the recipe's unit offset, not already stored in the weights).
    unit_offset: bool = False
    #: The leading dimensions of each head that RoPE rotates (``head_dim`` unless partial).
    rotary_dim: int = 0
    #: ``original_max_position_embeddings`` outside the RoPE parameters (Phi-3's older configs).
    original_max_position: int | None = None
    #: The experts (``Mlp.kind == "moe"``; None: every layer's MLP is dense).
    moe: MoeDims | None = None
    #: The latent attention (``Attention.kind == "mla"``; None: GQA).
    mla: MlaDims | None = None
    #: Per layer: a sliding layer by its type (``pattern.layer_sliding``; its window may be off).
    sliding: tuple[bool, ...] = ()
    #: The sliding layers' RoPE base and scaling (None: they rotate as the global layers).
    local_theta: float | None = None
    local_scaling: dict | None = None

    def window(self, layer: int) -> int | None:
        """The attention window of ``layer`` (None: the whole context)."""
        return self.windows[layer]

    @property
    def layer_types(self) -> tuple[str, ...]:
        """Per layer, transformers' name of its type: ``sliding_attention`` / ``full_attention``."""
        return tuple("sliding_attention" if s else "full_attention" for s in self.sliding)

    @property
    def global_theta(self) -> float:
        """The global layers' RoPE base (``rope_theta``), named as beside :attr:`local_theta`."""
        return self.rope_theta

    @property
    def global_scaling(self) -> dict | None:
        """The global layers' RoPE scaling (``rope_scaling``)."""
        return self.rope_scaling

    def layer_rope(self, layer: int) -> int:
        """Which RoPE table ``layer`` rotates with: 0 the global one, 1 the sliding layers' own."""
        return int(self.local_theta is not None and self.sliding[layer])

    @classmethod
    def from_config(cls, config: Mapping[str, Any], spec: DecoderSpec, *, gguf: bool = False) -> DecoderDims:
        name = spec.name
        if isinstance(config.get("text_config"), Mapping):  # a multimodal checkpoint: its text decoder
            outer_eos = config.get("eos_token_id")
            config = dict(config["text_config"])
            config.setdefault("eos_token_id", outer_eos)
        if config.get("use_bidirectional_attention"):
            raise ConfigError(f"{name}: use_bidirectional_attention (embedding models) is not supported")
        unbuilt = spec.unbuilt()
        if unbuilt:
            raise ConfigError(f"{name}: the definition declares {', '.join(unbuilt)}, not built yet")
        quant = (config.get("quantization_config") or {}).get("quant_method")
        if quant == "mxfp4" and not gguf and spec.mlp.kind != "moe":
            raise ConfigError(f"{name}: an HF MXFP4 checkpoint quantizes experts, and this definition has none")
        act = config.get("hidden_activation") or config.get("hidden_act", spec.activations[0])
        if act not in spec.activations:
            key = "hidden_activation" if config.get("hidden_activation") else "hidden_act"
            raise ConfigError(
                f"{key} {act!r} is not supported by the {name} loader (only {'/'.join(spec.activations)})"
            )
        hidden = int(_require(config, "hidden_size"))
        heads = int(_require(config, "num_attention_heads"))
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        theta, scaling, local_theta, local_scaling = _rope(config, spec)
        mla = MlaDims.from_config(config, name, heads, scaling) if spec.attention.kind == "mla" else None
        if mla is not None:
            kv_heads, head_dim = heads, mla.shape.rope
        if heads % kv_heads or head_dim % 2:
            raise ConfigError(
                f"{name}: {heads} heads / {kv_heads} KV heads / head_dim {head_dim} is not a valid GQA layout"
            )
        params = config.get("rope_parameters") or {}
        partial = float(config.get("partial_rotary_factor") or params.get("partial_rotary_factor") or 1.0)
        rotary_dim = int(head_dim * partial)
        if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
            raise ConfigError(f"{name}: partial_rotary_factor {partial} gives {rotary_dim} rotary dims of {head_dim}")
        layers = int(_require(config, "num_hidden_layers"))
        attention_bias = bool(config.get("attention_bias", False))
        eos = config.get("eos_token_id")
        eos_ids = () if eos is None else tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
        attn = spec.attention
        moe = MoeDims.from_config(config, spec, layers) if spec.mlp.kind == "moe" else None
        all_sparse = moe is not None and all(moe.sparse)
        return cls(
            vocab_size=int(_require(config, "vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(config.get("intermediate_size") or 0)
            if all_sparse
            else int(_require(config, "intermediate_size")),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(config.get("rms_norm_eps", spec.default_eps)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position=int(config.get("max_position_embeddings", spec.default_max_position)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qk_norm=attn.qk_norm,
            qkv_bias=attn.qkv_bias == "always" or (attn.qkv_bias == "config" and attention_bias),
            o_bias=attn.o_bias == "config" and attention_bias,
            mlp_bias=spec.mlp.bias == "always" or (spec.mlp.bias == "config" and bool(config.get("mlp_bias", False))),
            eos_token_ids=eos_ids,
            windows=layer_windows(config, spec, layers),
            ropes=layer_ropes(config, spec, layers),
            attn_scale=mla.scale
            if mla is not None
            else head_dim**-0.5
            if attn.scale is None
            else _on(config, attn.scale, name, "attention.scale"),
            attn_softcap=scalar(config, attn.softcap, name),
            embedding_scale=scalar(config, spec.scalars.embedding, name),
            residual_scale=scalar(config, spec.scalars.residual, name),
            logits_divisor=scalar(config, spec.scalars.logits, name),
            final_softcap=scalar(config, spec.scalars.final_softcap, name),
            unit_offset=spec.norms.unit_offset and not gguf,
            rotary_dim=rotary_dim,
            original_max_position=config.get("original_max_position_embeddings"),
            moe=moe,
            sliding=layer_sliding(config, spec, layers),
            local_theta=local_theta,
            local_scaling=local_scaling,
            mla=mla,
        )
