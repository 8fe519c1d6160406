"""Checkpoint config -> the mixture-of-experts dimensions of a decoder (:class:`MoeDims`).

Owner: ``metrale_core.decoder``; ``dims.DecoderDims.from_config`` reads it when the definition's
``Mlp.kind`` is ``moe``.

Invariants:
- The expert count is the config's ``num_experts`` / ``num_local_experts`` / ``n_routed_experts``,
  top-k its ``num_experts_per_tok``, an expert's width its ``moe_intermediate_size``.
- Layer ``i`` is sparse unless it is in ``mlp_only_layers``, below ``first_k_dense_replace``,
  ``(i + 1) % decoder_sparse_step != 0`` (transformers' Qwen2/3-MoE rule) or ``i % moe_layer_freq
  != 0`` (DeepSeek's); the dense layers run the ordinary MLP of width ``intermediate_size``.
- The shared expert's width is ``shared_expert_intermediate_size``, else ``moe_intermediate_size *
  n_shared_experts``; a definition that declares one and a config that gives neither is a
  ``ConfigError``.  ``normalize`` follows ``Mlp.norm_topk`` (``config``: ``norm_topk_prob``).
- Scoring is the config's ``scoring_func`` where it names one, else the definition's.  The
  correction bias is read where the definition declares it or the config's ``topk_method`` is
  ``noaux_tc`` (DeepSeek-V3); its groups are then ranked by the sum of their two best biased
  scores, otherwise (``group_limited_greedy``) by their best score.  Groups: ``n_group`` of them,
  the best ``topk_group`` kept (1 and 1 without groups); ``scale`` is ``routed_scaling_factor``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from attrs import frozen

from metrale_core.decoder.spec import DecoderSpec
from metrale_core.errors import ConfigError

__all__ = ["MoeDims"]


def _first(config: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    return next((config[k] for k in keys if config.get(k) is not None), None)


@frozen
class MoeDims:
    """The experts of a decoder, read from its config."""

    num_experts: int
    top_k: int
    #: One routed expert's intermediate width.
    intermediate_size: int
    #: The shared expert's intermediate width (0: no shared expert).
    shared_intermediate_size: int
    #: The top-k weights divided by their sum.
    normalize: bool
    #: Per layer: sparse (True) or the dense MLP.
    sparse: tuple[bool, ...]
    #: ``softmax`` or ``sigmoid`` router scores.
    scoring: Literal["softmax", "sigmoid"] = "softmax"
    #: The router has a selection-only correction bias (slot ``router_bias``).
    router_bias: bool = False
    #: Expert groups and how many of them a row may choose from (group-limited top-k).
    groups: int = 1
    topk_groups: int = 1
    #: How a group is ranked: its best score (``max``) or the sum of its two best (``top2``).
    group_score: Literal["max", "top2"] = "max"
    #: The routing weights' multiplier (``routed_scaling_factor``).
    scale: float = 1.0

    @classmethod
    def from_config(cls, config: Mapping[str, Any], spec: DecoderSpec, num_layers: int) -> MoeDims:
        name, mlp = spec.name, spec.mlp
        experts = _first(config, ("num_experts", "num_local_experts", "n_routed_experts"))
        top_k = config.get("num_experts_per_tok")
        width = config.get("moe_intermediate_size")
        if not experts or not top_k or not width:
            raise ConfigError(
                f"{name}: an MoE config needs num_experts, num_experts_per_tok and moe_intermediate_size "
                f"(got {experts}, {top_k}, {width})"
            )
        if not 0 < int(top_k) <= int(experts):
            raise ConfigError(f"{name}: num_experts_per_tok {top_k} is not within 1..{experts} experts")
        shared = 0
        if mlp.shared_experts:
            shared = int(config.get("shared_expert_intermediate_size") or 0)
            if not shared and config.get("n_shared_experts"):
                shared = int(width) * int(config["n_shared_experts"])
            if not shared:
                raise ConfigError(
                    f"{name}: the definition has a shared expert, the config no shared_expert_intermediate_size"
                )
        step = int(config.get("decoder_sparse_step") or 1)
        freq = int(config.get("moe_layer_freq") or 1)
        dense_first = int(config.get("first_k_dense_replace") or 0)
        only_mlp = {int(i) for i in config.get("mlp_only_layers") or ()}
        sparse = tuple(
            i not in only_mlp and i >= dense_first and (i + 1) % step == 0 and i % freq == 0 for i in range(num_layers)
        )
        normalize = mlp.norm_topk == "always" or (mlp.norm_topk == "config" and bool(config.get("norm_topk_prob")))
        scoring = config.get("scoring_func") or mlp.scoring
        if scoring not in ("softmax", "sigmoid"):
            raise ConfigError(f"{name}: scoring_func {scoring!r} is not softmax or sigmoid")
        method = config.get("topk_method")
        bias = mlp.router_bias or method == "noaux_tc"
        groups, topk_groups = int(config.get("n_group") or 1), int(config.get("topk_group") or 1)
        grouped = groups > 1 and (bias or method in (None, "group_limited_greedy"))
        if not grouped:
            groups = topk_groups = 1
        elif (
            int(experts) % groups or not 0 < topk_groups <= groups or int(top_k) > topk_groups * int(experts) // groups
        ):
            raise ConfigError(
                f"{name}: {experts} experts in n_group {groups} groups, topk_group {topk_groups}, "
                f"cannot give {top_k} experts a row"
            )
        return cls(
            int(experts),
            int(top_k),
            int(width),
            shared,
            normalize,
            sparse,
            scoring=scoring,
            router_bias=bias,
            groups=groups,
            topk_groups=topk_groups,
            group_score="top2" if bias else "max",
            scale=float(config.get("routed_scaling_factor") or 1.0),
        )
