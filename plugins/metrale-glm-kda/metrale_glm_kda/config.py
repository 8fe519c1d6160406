"""Checkpoint config -> the dimensions and per-layer schedule of a GLM-5.3 (``glm5_next``) decoder.

Owner: ``metrale_glm_kda``; the loader calls :meth:`GlmDims.from_config` once.

Invariants:
- The composite ``glm5_next`` config (text fields under ``text_config``) and the flat text-only
  config read the same; defaults and the derived schedules follow transformers'
  ``Glm5NextTextConfig.__post_init__`` (layer types, MLP types, indexer types from a pattern or
  the freq/offset rule, ``linear_attn_config`` overrides).
- ``layer_types`` holds ``"kda"`` or ``"mla"`` per layer; every ``"shared"`` indexer layer has an
  earlier ``"full"`` MLA layer whose selection it reuses, else the config is refused.
- Only what this plugin computes exactly is accepted (NoPE MLA, SiLU, one attention head per KV
  head); anything else is a ``ConfigError`` naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attrs import frozen

from metrale_core.api import ConfigError

__all__ = ["GlmDims", "text_config"]


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The text decoder's fields: ``text_config`` of a composite config, else the config itself."""
    nested = config.get("text_config")
    return dict(nested) if isinstance(nested, Mapping) else dict(config)


def _require(cfg: Mapping[str, Any], key: str) -> Any:
    value = cfg.get(key)
    if value is None:
        raise ConfigError(f"glm5_next config lacks {key!r}")
    return value


def _layer_types(cfg: Mapping[str, Any], n: int) -> tuple[str, ...]:
    raw = cfg.get("layer_types") or ["linear_attention" if i % 4 != 3 else "indexed_attention" for i in range(n)]
    names = {
        "linear_attention": "kda",
        "indexed_attention": "mla",
        "full_attention": "mla",
        "deepseek_sparse_attention": "mla",
    }
    if len(raw) != n or any(t not in names for t in raw):
        raise ConfigError(f"glm5_next layer_types must list {n} entries from {sorted(names)}, got {raw}")
    return tuple(names[t] for t in raw)


def _indexer_types(cfg: Mapping[str, Any], n: int) -> tuple[str, ...]:
    raw = cfg.get("indexer_types")
    if raw is None:
        pattern = cfg.get("index_topk_pattern")
        if pattern is not None:
            raw = [{"F": "full", "S": "shared"}[c] for c in pattern] if isinstance(pattern, str) else list(pattern)
        else:
            freq = max(int(cfg.get("index_topk_freq", 1)), 1)
            offset = int(cfg.get("index_skip_topk_offset", 2))
            raw = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]
    if len(raw) != n or any(t not in ("full", "shared") for t in raw):
        raise ConfigError(f"glm5_next indexer_types must list {n} entries of 'full'/'shared', got {raw}")
    return tuple(raw)


def _eos(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(e) for e in (value if isinstance(value, list) else [value]))


@frozen
class GlmDims:
    """Dimensions and switches of one GLM-5.3 text decoder."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    rms_norm_eps: float
    max_position: int
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    #: Per layer: ``"kda"`` (linear attention) or ``"mla"`` (DSA attention).
    layer_types: tuple[str, ...]
    #: Per layer: ``"full"`` (own indexer) or ``"shared"`` (reuse an earlier full layer's selection).
    indexer_types: tuple[str, ...]
    #: Per layer: ``"dense"`` or ``"sparse"`` (MoE).
    mlp_types: tuple[str, ...]
    # dense MLP / MoE
    intermediate_size: int
    moe_intermediate_size: int
    n_routed_experts: int
    n_shared_experts: int
    top_k: int
    n_group: int
    topk_group: int
    norm_topk_prob: bool
    routed_scaling_factor: float
    swiglu_limit: float | None
    # MLA (NoPE) + DSA indexer
    num_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    v_head_dim: int
    index_topk: int
    index_head_dim: int
    index_n_heads: int
    index_kpool: int
    index_tail: bool
    # KDA
    linear_num_heads: int
    linear_head_dim: int
    conv_kernel: int
    #: Lower-bound ("safe") gate ``lb * sigmoid(...)``; None selects the softplus gate.
    lower_bound: float | None
    # mHC
    hc_mult: int
    hc_eps: float
    hc_sinkhorn_iters: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> GlmDims:
        cfg = text_config(config)
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"glm5_next: hidden_act {act!r} is not supported (only silu)")
        rope = int(cfg.get("qk_rope_head_dim") or 0)
        if rope:
            raise ConfigError(f"glm5_next attention is NoPE; qk_rope_head_dim={rope} is not supported")
        heads = int(cfg.get("num_attention_heads", 64))
        if int(cfg.get("num_key_value_heads") or heads) != heads:
            raise ConfigError("glm5_next: num_key_value_heads must equal num_attention_heads")
        if cfg.get("attention_bias"):
            raise ConfigError("glm5_next: attention_bias=True is not supported")
        n = int(_require(cfg, "num_hidden_layers"))
        lower_bound = cfg.get("linear_lower_bound", -5.0)
        heads_lin = int(cfg.get("linear_num_heads", 64))
        head_dim_lin = int(cfg.get("linear_head_dim", 128))
        conv = int(cfg.get("linear_conv_kernel_dim", 4))
        lin = cfg.get("linear_attn_config")
        if isinstance(lin, Mapping):
            head_dim_lin = int(lin.get("head_dim", head_dim_lin))
            heads_lin = int(lin.get("num_heads", heads_lin))
            conv = int(lin.get("short_conv_kernel_size", conv))
            lower_bound = lin.get("gate_lower_bound", lin.get("lower_bound", lower_bound))
            if lin.get("safe_gate", True) and lower_bound is None:
                lower_bound = -5.0
        mlp_types = tuple(cfg.get("mlp_layer_types") or (["dense"] * min(3, n) + ["sparse"] * (n - 3)))
        if len(mlp_types) != n or any(t not in ("dense", "sparse") for t in mlp_types):
            raise ConfigError(f"glm5_next mlp_layer_types must list {n} entries of 'dense'/'sparse'")
        dims = cls(
            vocab_size=int(_require(cfg, "vocab_size")),
            hidden_size=int(_require(cfg, "hidden_size")),
            num_layers=n,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
            max_position=int(cfg.get("max_position_embeddings", 1048576)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))),
            eos_token_ids=_eos(cfg.get("eos_token_id", config.get("eos_token_id"))),
            layer_types=_layer_types(cfg, n),
            indexer_types=_indexer_types(cfg, n),
            mlp_types=mlp_types,
            intermediate_size=int(cfg.get("intermediate_size", 12288)),
            moe_intermediate_size=int(cfg.get("moe_intermediate_size", 2048)),
            n_routed_experts=int(cfg.get("n_routed_experts", cfg.get("num_local_experts", 288))),
            n_shared_experts=int(cfg.get("n_shared_experts", 1)),
            top_k=int(cfg.get("num_experts_per_tok", 8)),
            n_group=int(cfg.get("n_group", 1)),
            topk_group=int(cfg.get("topk_group", 1)),
            norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
            routed_scaling_factor=float(cfg.get("routed_scaling_factor", 2.5)),
            swiglu_limit=None if cfg.get("swiglu_limit", 10.0) is None else float(cfg.get("swiglu_limit", 10.0)),
            num_heads=heads,
            q_lora_rank=int(_require(cfg, "q_lora_rank")),
            kv_lora_rank=int(cfg.get("kv_lora_rank", 512)),
            qk_nope_head_dim=int(cfg.get("qk_nope_head_dim", 256)),
            v_head_dim=int(cfg.get("v_head_dim", 256)),
            index_topk=int(cfg.get("index_topk", 2048)),
            index_head_dim=int(cfg.get("index_head_dim", 128)),
            index_n_heads=int(cfg.get("index_n_heads", 32)),
            index_kpool=int(cfg.get("index_kpool", 16)),
            index_tail=bool(cfg.get("index_kpool_always_select_tail", True)),
            linear_num_heads=heads_lin,
            linear_head_dim=head_dim_lin,
            conv_kernel=conv,
            lower_bound=None if lower_bound is None else float(lower_bound),
            hc_mult=int(cfg.get("hc_mult", 4)),
            hc_eps=float(cfg.get("hc_eps", 1e-6)),
            hc_sinkhorn_iters=int(cfg.get("hc_sinkhorn_iters", 20)),
        )
        dims.validate()
        return dims

    def validate(self) -> None:
        if self.index_kpool < 1 or self.index_topk % self.index_kpool:
            raise ConfigError(
                f"glm5_next: index_topk ({self.index_topk}) must be a positive multiple of "
                f"index_kpool ({self.index_kpool})"
            )
        if self.n_routed_experts % self.n_group or not 1 <= self.topk_group <= self.n_group:
            raise ConfigError(
                f"glm5_next: {self.n_routed_experts} experts in {self.n_group} groups with "
                f"topk_group={self.topk_group} is not a valid routing layout"
            )
        if self.conv_kernel < 2:
            raise ConfigError(f"glm5_next: linear_conv_kernel_dim must be >= 2, got {self.conv_kernel}")
        seen_full = False
        for i, (kind, idx) in enumerate(zip(self.layer_types, self.indexer_types)):
            if kind != "mla":
                continue
            if idx == "full":
                seen_full = True
            elif not seen_full:
                raise ConfigError(
                    f"glm5_next: layer {i} shares the indexer selection but no earlier "
                    "attention layer runs a full indexer"
                )

    # --- derived sizes ---------------------------------------------------------------------
    @property
    def kda_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "kda")

    @property
    def mla_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "mla")

    @property
    def linear_dim(self) -> int:
        """``H * K`` of one of q, k, v in a KDA layer."""
        return self.linear_num_heads * self.linear_head_dim

    @property
    def indexer_cache_dim(self) -> int:
        """Per-token indexer cache: the normalised indexer key and the k-pool gate scores."""
        return 2 * self.index_head_dim
