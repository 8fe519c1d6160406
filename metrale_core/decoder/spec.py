"""The decoder definition: one frozen description of a decoder family, built by the core.

Owner: ``metrale_core.decoder``.  A family is a :class:`DecoderSpec`: its names (loader name, HF
``architectures``, ``model_type`` values), the block recipe (:class:`Norms`, :class:`Attention`,
:class:`Mlp`), the per-layer variation (:class:`LayerPattern`), the scalars (:class:`Scalars`) and
its weight-name table (:class:`~metrale_core.decoder.names.WeightNames`, HF and GGUF names).
Dimensions, epsilon, RoPE kind and scaling come from each checkpoint's config
(``metrale_core.decoder.dims``); :func:`metrale_core.decoder.build.build_decoder` makes the model
on ``metrale_core.layers`` with every weight format, tensor parallelism (where the recipe can be
sharded) and LoRA (every projection is built with the recording ``build_linear``, under its
checkpoint module path).  :meth:`DecoderSpec.loader_spec` is the family's ``ModelLoaderSpec``.

Every default is the Llama decoder, so a family states only what differs.  What is declared but
not built yet -- MLA, MoE, attention sinks, attention soft-capping, sliding windows, NoPE layers,
GeGLU, the scalars, a fused ``gate_up_proj`` tensor -- is accepted here (so Gemma 3 and GLM-5.3
can be written down) and refused at load with a ``ConfigError`` naming the field
(:meth:`DecoderSpec.unbuilt`).  RoPE kinds: default, linear and llama3 are built; yarn and
longrope are read from the config and refused the same way.

Invariants:
- This module imports no torch (plugins build their definitions while registering, and
  ``met plugins`` imports no torch); the builder is imported when a model loads.
- Every record is frozen: a definition is a value, shared by every load of its family.
"""

from __future__ import annotations

from typing import Any, Literal

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
ROPE_KINDS = ("default", "linear", "llama3", "yarn", "longrope")
ROPE_KINDS_BUILT = ("default", "linear", "llama3")

#: The ``--weight-format`` values every definition's loader honours (``metrale_core.layers.linear``'s
#: ``WEIGHT_FORMATS``, repeated so that registering imports no torch; a test keeps the two equal).
WEIGHT_FORMATS = ("auto", "exact", "bf16", "int8", "int4")

#: A scalar: off (None), a constant, or the config key holding it.
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
    #: Gemma's ``(1 + w)`` weights.  Not built yet.
    unit_offset: bool = False


@frozen
class Attention:
    """The attention of every layer (per-layer variation: :class:`LayerPattern`)."""

    #: ``full`` (GQA over the paged cache) or ``mla`` (multi-head latent attention; not built yet).
    kind: Literal["full", "mla"] = "full"
    #: RMSNorm of q and k before RoPE: ``none``, ``head`` (per head, weight ``[head_dim]``: Qwen3,
    #: Gemma 3) or ``proj`` (over the whole projection, weight ``[heads * head_dim]``: OLMo 2).
    qk_norm: Literal["none", "head", "proj"] = "none"
    #: q/k/v bias: ``config`` (the config's ``attention_bias``), ``always`` (Qwen2) or ``never``.
    qkv_bias: Literal["config", "always", "never"] = "config"
    #: o_proj bias: ``config`` (``attention_bias``) or ``never`` (Qwen2).
    o_bias: Literal["config", "never"] = "config"
    #: Learned per-head attention sinks (gpt-oss).  Not built yet.
    sinks: bool = False
    #: Attention-logit soft-cap (a :data:`Scalar`; Gemma 2).  Not built yet.
    softcap: Scalar = None


@frozen
class Mlp:
    """The MLP of every layer."""

    #: ``swiglu`` (silu gate), ``geglu`` (tanh-gelu gate; not built yet) or ``moe`` (not built yet).
    kind: Literal["swiglu", "geglu", "moe"] = "swiglu"
    #: Biases on gate/up/down: ``config`` (the config's ``mlp_bias``) or ``never``.
    bias: Literal["config", "never"] = "config"
    #: The checkpoint stores ``gate_up_proj`` as one tensor (Phi-3).  Not built yet.
    fused_gate_up: bool = False
    #: MoE: shared experts beside the routed ones (GLM, DeepSeek).  Not built yet.
    shared_experts: bool = False


@frozen
class LayerPattern:
    """What varies from layer to layer."""

    #: Config key of the sliding-window size; None: every layer attends to the whole context.
    #: Not built yet.
    sliding_window: str | None = None
    #: With ``sliding_window``: every k-th layer (1-based) is global, the others slide.
    global_every: int | None = None
    #: Every k-th layer (1-based) has no RoPE (NoPE).  Not built yet.
    nope_every: int | None = None


@frozen
class Scalars:
    """Multipliers and soft-caps of the stream (each a :data:`Scalar`).  Not built yet."""

    embedding: Scalar = None
    residual: Scalar = None
    logits: Scalar = None
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

    def __attrs_post_init__(self) -> None:
        if not self.model_types:
            object.__setattr__(self, "model_types", (self.name,))

    def unbuilt(self) -> list[str]:
        """The declared fields the builder does not build yet (empty: this family loads)."""
        n, a, m, p, s = self.norms, self.attention, self.mlp, self.layers, self.scalars
        checks = [
            (n.unit_offset, "norms.unit_offset"),
            (a.kind != "full", f"attention.kind={a.kind!r}"),
            (a.sinks, "attention.sinks"),
            (a.softcap is not None, "attention.softcap"),
            (m.kind != "swiglu", f"mlp.kind={m.kind!r}"),
            (m.fused_gate_up, "mlp.fused_gate_up"),
            (m.shared_experts, "mlp.shared_experts"),
            (p.sliding_window is not None, "layers.sliding_window"),
            (p.nope_every is not None, "layers.nope_every"),
            *(
                (getattr(s, k) is not None, f"scalars.{k}")
                for k in ("embedding", "residual", "logits", "final_softcap")
            ),
        ]
        return [what for declared, what in checks if declared]

    @property
    def tensor_parallel_note(self) -> str:
        """Why this family cannot be sharded ('' when it can)."""
        if self.attention.qk_norm == "proj":
            return (
                f"{self.name}: the QK-norm over the whole projection needs every head's values "
                "(a cross-rank reduction per layer that is not built)"
            )
        return ""

    def load(self, store: Any, options: Any) -> Any:
        """The loader factory: ``(store, LoadOptions) -> CausalLM`` (imports torch here)."""
        from metrale_core.decoder.build import build_decoder

        return build_decoder(self, store, options)

    def loader_spec(self) -> Any:
        """This family's ``ModelLoaderSpec``: every weight format, tensor parallelism where the
        recipe can be sharded (else refused with :attr:`tensor_parallel_note`)."""
        from metrale_core.components import ModelLoaderSpec

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
