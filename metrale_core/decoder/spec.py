"""The decoder definition: one frozen description of a decoder family, built by the core.

Owner: ``metrale_core.decoder``.  A family is a :class:`DecoderSpec`: its names (loader name, HF
``architectures``, ``model_type`` values), the block recipe (:class:`Norms`, :class:`Attention`,
:class:`Mlp`), the per-layer variation (:class:`LayerPattern`), the scalars (:class:`Scalars`) and
its weight-name table (:class:`~metrale_core.decoder.names.WeightNames`, HF and GGUF names).
Dimensions, epsilon, RoPE kind and scaling come from each checkpoint's config
(``metrale_core.decoder.dims``); :func:`metrale_core.decoder.build.build_decoder` makes the model
on ``metrale_core.layers`` with every weight format, tensor parallelism (where the recipe can be
sharded) and LoRA (every attention and dense-MLP projection is declared, by its path and its
checkpoint module paths, in ``DecoderLM.lora_targets()``).  :meth:`DecoderSpec.loader_spec` is
the family's ``ModelLoaderSpec``.

Every default is the Llama decoder, so a family states only what differs.  Built: the norm
placement and Gemma's unit-offset norms, QK-norm, sliding windows with a per-layer pattern (and the
sliding layers' own RoPE base),
attention-logit and final-logit soft-caps, the softmax scale, NoPE layers, GeGLU, the stream's
multipliers (:class:`Scalars`), fused ``qkv_proj`` / ``gate_up_proj`` tensors, an explicit
``head_dim``, partial rotary dimensions, and mixture-of-experts MLPs (``Mlp(kind="moe")``: softmax
or sigmoid routing, top-k with optional renormalisation, a shared expert with an optional sigmoid
gate, DeepSeek's group-limited top-k, ``routed_scaling_factor`` and the selection-only correction
bias; the sparse layers are the config's ``decoder_sparse_step`` / ``mlp_only_layers`` /
``first_k_dense_replace`` / ``moe_layer_freq``), DeepSeek's multi-head latent attention
(``Attention(kind="mla")``, ``metrale_core.layers.blocks.mla``), gpt-oss's learned attention sinks, its
top-k-then-softmax router with a bias, biased experts and clamped SwiGLU
(``Mlp.expert_act="swiglu_oai"``).  A field declared but not built is refused at load with a
``ConfigError`` naming it (:meth:`DecoderSpec.unbuilt`).  RoPE kinds: default, linear, llama3,
longrope and yarn (with DeepSeek's ``mscale`` / ``mscale_all_dim``) are built.

A :data:`Scalar` is off (None), a constant, or read from the config: ``"key"`` (the key's value;
absent or null: off) or ``"key**p"`` (its power ``p``: Gemma's ``"hidden_size**0.5"``).

Invariants:
- This module imports no torch (plugins build their definitions while registering, and
  ``met plugins`` imports no torch); the builder is imported when a model loads.
- Every record is frozen: a definition is a value, shared by every load of its family.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from attrs import field, frozen

from metrale_core.decoder.names import LLAMA_NAMES, WeightNames

__all__ = [
    "ROPE_KINDS",
    "ROPE_KINDS_BUILT",
    "WEIGHT_FORMATS",
    "Attention",
    "DecoderSpec",
    "LayerPattern",
    "Mlp",
    "Norms",
    "Scalar",
    "Scalars",
]

#: RoPE kinds a config may name (``rope_scaling.rope_type``) and those the layers build.
ROPE_KINDS = ("default", "linear", "llama3", "yarn", "longrope", "freq_factors")
ROPE_KINDS_BUILT = ROPE_KINDS

#: The ``--weight-format`` values every definition's loader honours (``metrale_core.layers.formats.linear``'s
#: ``WEIGHT_FORMATS``, repeated so that registering imports no torch; a test keeps the two equal).
WEIGHT_FORMATS = ("auto", "exact", "bf16", "int8", "int4")

#: A scalar: off (None), a constant, or ``"key"`` / ``"key**p"`` read from the config.
Scalar = float | str | None


@frozen
class Norms:
    """Where a layer's RMSNorms sit: ``x + out(attn(in(x)))``, then ``h + out(mlp(in(h)))``."""

    #: Before attention (``attn_norm``); False: attention reads the residual stream (OLMo 2).
    pre_attn: bool = True
    #: On attention's output, before the residual add (``attn_out_norm``; Gemma, OLMo 2).
    post_attn: bool = False
    #: Before the MLP (``mlp_norm``).
    pre_mlp: bool = True
    #: On the MLP's output, before the residual add (``mlp_out_norm``).
    post_mlp: bool = False
    #: Gemma's ``(1 + w)`` weights (a GGUF stores ``1 + w`` already: read as plain weights).
    unit_offset: bool = False


@frozen
class Attention:
    """The attention of every layer (per-layer variation: :class:`LayerPattern`)."""

    #: ``full`` (GQA over the paged cache) or ``mla`` (DeepSeek's multi-head latent attention: the
    #: config's ``q_lora_rank`` / ``kv_lora_rank`` / ``qk_{nope,rope}_head_dim`` / ``v_head_dim``;
    #: ``decoder.mla``, ``layers.mla``).
    kind: Literal["full", "mla"] = "full"
    #: RMSNorm of q and k before RoPE: ``none``, ``head`` (per head, weight ``[head_dim]``: Qwen3,
    #: Gemma 3) or ``proj`` (over the whole projection, weight ``[heads * head_dim]``: OLMo 2).
    qk_norm: Literal["none", "head", "proj"] = "none"
    #: q/k/v bias: ``config`` (the config's ``attention_bias``), ``always`` (Qwen2) or ``never``.
    qkv_bias: Literal["config", "always", "never"] = "config"
    #: o_proj bias: ``config`` (``attention_bias``) or ``never`` (Qwen2).
    o_bias: Literal["config", "never"] = "config"
    #: A learned per-head sink logit joins each softmax's denominator (no value; gpt-oss, slot
    #: ``sinks``); such layers attend through ``windowed_paged_attention``.
    sinks: bool = False
    #: Attention-logit soft-cap, ``cap * tanh(scores / cap)`` (a :data:`Scalar`; Gemma 2).
    softcap: Scalar = None
    #: The softmax scale (a :data:`Scalar`; None: ``head_dim ** -0.5``; Granite
    #: ``"attention_multiplier"``, Gemma ``"query_pre_attn_scalar**-0.5"``).
    scale: Scalar = None
    #: The checkpoint stores ``qkv_proj`` as one tensor ``[q; k; v]`` (Phi-3; slot ``qkv``).
    fused_qkv: bool = False


@frozen
class Mlp:
    """The MLP of every layer."""

    #: ``swiglu`` (silu gate), ``geglu`` (tanh-gelu gate) or ``moe`` (routed experts, each a
    #: gated MLP with the config's activation, in the sparse layers; the others are ``swiglu``).
    kind: Literal["swiglu", "geglu", "moe"] = "swiglu"
    #: Biases on gate/up/down (and an MoE router): ``config`` (the config's ``mlp_bias``),
    #: ``always`` (gpt-oss) or ``never``.
    bias: Literal["config", "always", "never"] = "config"
    #: The checkpoint stores ``gate_up_proj`` as one tensor ``[gate; up]`` (Phi-3; slot ``gate_up``).
    fused_gate_up: bool = False
    #: MoE: a shared expert beside the routed ones (size ``shared_expert_intermediate_size``, or
    #: ``moe_intermediate_size * n_shared_experts``; Qwen2-MoE, DeepSeek).
    shared_experts: bool = False
    #: MoE: the shared expert's output times ``sigmoid(shared_expert_gate(x))`` (Qwen2-MoE).
    shared_gate: bool = False
    #: MoE: router scores, ``softmax`` over the experts, ``sigmoid`` of each, or ``topk_softmax``
    #: (the top-k logits chosen first, softmax over those k: gpt-oss); a config's
    #: ``scoring_func`` overrides it.
    scoring: Literal["softmax", "sigmoid", "topk_softmax"] = "softmax"
    #: MoE: the top-k weights divided by their sum: ``config`` (``norm_topk_prob``), ``always``, ``never``.
    norm_topk: Literal["config", "always", "never"] = "config"
    #: MoE: a selection-only correction bias on the scores (DeepSeek-V3's ``e_score_correction_bias``,
    #: slot ``router_bias``): True always; also read wherever the config's ``topk_method`` is
    #: ``noaux_tc`` (``moe_dims``).
    router_bias: bool = False
    #: MoE: the config key of one routed expert's width (gpt-oss: ``intermediate_size``).
    expert_width: str = "moe_intermediate_size"
    #: MoE: the experts' activation: ``config`` (the gated MLP of the config's ``hidden_act``) or
    #: ``swiglu_oai`` (gpt-oss: gate clamped above at ``swiglu_limit``, up at +-limit,
    #: ``(up + 1) * gate * sigmoid(swiglu_alpha * gate)``).
    expert_act: Literal["config", "swiglu_oai"] = "config"


@frozen
class LayerPattern:
    """What varies from layer to layer."""

    #: Config key of the sliding-window size; None: every layer attends to the whole context.
    #: Which layers slide: the config's ``layer_types`` where it has them, else every layer but
    #: every ``global_every``-th; a null window or ``use_sliding_window: false`` turns them off.
    sliding_window: str | None = None
    #: With ``sliding_window`` and no ``layer_types``: every k-th layer (1-based) is global.
    global_every: int | None = None
    #: Every k-th layer (1-based) has no RoPE (NoPE), unless the config lists
    #: ``no_rope_layers`` (1: RoPE, 0: NoPE) or sets ``no_rope_layer_interval`` (SmolLM3).
    nope_every: int | None = None
    #: The sliding layers rotate with their own RoPE base, unscaled (a :data:`Scalar`; Gemma 3
    #: ``"rope_local_base_freq"``, 10,000 where the config lacks it, as transformers defaults it);
    #: None: every layer rotates with ``rope_theta`` / ``rope_scaling``.  transformers >= 5's
    #: ``rope_parameters`` per layer type (``full_attention`` / ``sliding_attention``) are read
    #: whatever this says.
    sliding_rope_theta: Scalar = None


@frozen
class Scalars:
    """Multipliers and soft-caps of the stream (each a :data:`Scalar`; None: off)."""

    #: Multiplies the token embeddings (in the activation dtype; Gemma ``"hidden_size**0.5"``,
    #: Granite ``"embedding_multiplier"``).
    embedding: Scalar = None
    #: Multiplies each branch before its residual add (Granite ``"residual_multiplier"``).
    residual: Scalar = None
    #: Divides the logits (Granite ``"logits_scaling"``).
    logits: Scalar = None
    #: Final-logit soft-cap, ``cap * tanh(logits / cap)`` (Gemma 2 ``"final_logit_softcapping"``).
    final_softcap: Scalar = None


def _names(value: Any) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


@frozen
class DecoderSpec:
    """A decoder family; see the module docstring."""

    #: Registered loader name and ``ModelInfo.architecture``.
    name: str
    #: HF ``architectures`` entries this family serves.
    architectures: tuple[str, ...] = field(converter=_names)
    description: str = ""
    #: ``model_type`` values this family serves (default: ``(name,)``).
    model_types: tuple[str, ...] = field(converter=_names, default=())
    norms: Norms = Norms()
    attention: Attention = Attention()
    mlp: Mlp = Mlp()
    layers: LayerPattern = LayerPattern()
    scalars: Scalars = Scalars()
    names: WeightNames = field(default=LLAMA_NAMES, repr=False)
    #: The config's ``hidden_act`` values the MLP runs (its gate's activation).
    activations: tuple[str, ...] = field(converter=_names, default=("silu",))
    #: The config's ``rms_norm_eps`` when it has none.
    default_eps: float = 1e-6
    #: The config's ``max_position_embeddings`` when it has none (Gemma 3: 131,072).
    default_max_position: int = 4096

    #: The ``--weight-format`` values the loader honours (:data:`WEIGHT_FORMATS`).
    weight_formats: ClassVar[tuple[str, ...]] = WEIGHT_FORMATS

    def __attrs_post_init__(self) -> None:
        if not self.model_types:
            object.__setattr__(self, "model_types", (self.name,))

    def unbuilt(self) -> list[str]:
        """The declared fields the builder does not build yet (empty: this family loads)."""
        a, m = self.attention, self.mlp
        checks = [
            (a.kind == "mla" and a.fused_qkv, "attention.fused_qkv with attention.kind='mla'"),
            (a.kind == "mla" and a.sinks, "attention.sinks with attention.kind='mla'"),
            (m.kind != "moe" and (m.shared_experts or m.shared_gate), "mlp.shared_experts without mlp.kind='moe'"),
        ]
        return [what for declared, what in checks if declared]

    @property
    def tensor_parallel_note(self) -> str:
        """Why this family cannot be sharded ('' when it can)."""
        if self.attention.kind == "mla":
            return f"{self.name}: its latent attention is not sharded between ranks yet"
        if self.attention.sinks:
            return f"{self.name}: its attention sinks are not split between ranks yet"
        if self.attention.qk_norm == "proj":
            return (
                f"{self.name}: the QK-norm over the whole projection needs every head's values "
                "(a cross-rank reduction per layer that is not built)"
            )
        if self.attention.fused_qkv or self.mlp.fused_gate_up:
            return (
                f"{self.name}: its checkpoint stores fused qkv_proj / gate_up_proj tensors, whose "
                "per-rank slices are not built"
            )
        return ""

    def dims(self, config: Any, *, gguf_metadata: Any = None) -> Any:
        """The ``DecoderDims`` this family reads from an HF ``config``, or from a GGUF's
        llama-shaped ``config`` and its full ``gguf_metadata`` (the arch's own keys added as the
        GGUF store adds them)."""
        from metrale_core.decoder.dims import DecoderDims

        if gguf_metadata is None:
            return DecoderDims.from_config(config, self)
        from metrale_core.weights.gguf_arch import metadata_config

        return DecoderDims.from_config(metadata_config(config, gguf_metadata), self, gguf=True)

    def load(self, store: Any, options: Any) -> Any:
        """The loader factory: ``(store, LoadOptions) -> CausalLM`` (imports torch here)."""
        from metrale_core.decoder.build import build_decoder

        return build_decoder(self, store, options)

    def loader_spec(self) -> Any:
        """This family's ``ModelLoaderSpec``: every weight format, tensor parallelism where the
        recipe can be sharded (else refused with :attr:`tensor_parallel_note`)."""
        from metrale_core.plugin.components import ModelLoaderSpec

        note = self.tensor_parallel_note
        return ModelLoaderSpec(
            name=self.name,
            factory=self.load,
            model_types=self.model_types,
            architectures=self.architectures,
            description=self.description,
            weight_formats=WEIGHT_FORMATS,
            tensor_parallel=not note,
            tensor_parallel_note=note,
        )
