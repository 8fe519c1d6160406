"""Checkpoint config -> Gemma 3 decoder dimensions, from an HF config or GGUF metadata.

Owner: ``metrale_gemma3``; :func:`Gemma3Dims.from_store` is read once per load (``loader.py``).

Invariants:
- HF configs: ``gemma3_text`` at the top level, or ``gemma3`` with the text model under
  ``text_config``; both the transformers >= 5 form (``rope_parameters`` per layer type) and the
  older one (``rope_theta`` / ``rope_local_base_freq`` / ``rope_scaling``) are read.
- The layer pattern comes from ``layer_types`` or, failing that, ``sliding_window_pattern``
  (every N-th layer global, N = 6 by default), as transformers derives it.
- GGUF (``gemma3`` arch): ``gemma3.attention.sliding_window``, the global RoPE base from
  ``gemma3.rope.freq_base`` and the local one 10,000, every 6th layer global, the attention scale
  ``1/sqrt(head_dim)`` (llama.cpp's reading of the same file); norm weights are stored as
  ``1 + w`` by llama.cpp's converter (``norm_shift``), which :attr:`norm_offset_stored` records;
  ``<end_of_turn>`` (the file's EOT id, or the token of that text) ends generation besides EOS.
- ``attn_logit_softcapping`` is read but not applied: Gemma 3 configs carry it, yet neither
  transformers' ``Gemma3Attention`` nor llama.cpp's gemma3 graph uses it (Gemma 2 did);
  ``final_logit_softcapping`` is applied where set.
- Anything this family cannot run is a ``ConfigError`` naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attrs import frozen

from metrale_core.api import ConfigError

__all__ = ["Gemma3Dims"]

_DEFAULT_GLOBAL_THETA = 1_000_000.0
_DEFAULT_LOCAL_THETA = 10_000.0
_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_tanh")


def _require(config: Mapping[str, Any], key: str) -> Any:
    value = config.get(key)
    if value is None:
        raise ConfigError(f"gemma3: the model config lacks {key!r}")
    return value


def _layer_types(config: Mapping[str, Any], num_layers: int) -> tuple[str, ...]:
    types = config.get("layer_types")
    if types is None:
        pattern = int(config.get("sliding_window_pattern") or 6)
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
    types = tuple(types)
    if len(types) != num_layers or set(types) - {"sliding_attention", "full_attention"}:
        raise ConfigError(
            f"gemma3: layer_types must list {num_layers} entries of sliding_attention / "
            f"full_attention, got {list(types)}"
        )
    return types


def _scaling(params: Mapping[str, Any] | None) -> dict | None:
    """The RoPE scaling dict ``rope_inv_freq`` takes, or None for plain RoPE."""
    if not params:
        return None
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return None
    return {k: v for k, v in params.items() if k != "rope_theta"} | {"rope_type": kind}


def _ropes(config: Mapping[str, Any]) -> tuple[float, dict | None, float, dict | None]:
    """``(global_theta, global_scaling, local_theta, local_scaling)``."""
    params = config.get("rope_parameters")
    if isinstance(params, dict) and ("full_attention" in params or "sliding_attention" in params):
        full = params.get("full_attention") or {}
        local = params.get("sliding_attention") or {}
        return (
            float(full.get("rope_theta", _DEFAULT_GLOBAL_THETA)),
            _scaling(full),
            float(local.get("rope_theta", _DEFAULT_LOCAL_THETA)),
            _scaling(local),
        )
    theta = config.get("rope_theta")
    if theta is None and isinstance(params, dict):
        theta = params.get("rope_theta")
    scaling = config.get("rope_scaling") if isinstance(config.get("rope_scaling"), dict) else None
    return (
        float(theta if theta is not None else _DEFAULT_GLOBAL_THETA),
        _scaling(scaling),
        float(config.get("rope_local_base_freq") or _DEFAULT_LOCAL_THETA),
        None,
    )


@frozen
class Gemma3Dims:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    #: Softmax scale of every layer (``query_pre_attn_scalar ** -0.5``).
    attn_scale: float
    #: ``"sliding_attention"`` / ``"full_attention"`` per layer.
    layer_types: tuple[str, ...]
    #: Window of the sliding layers, in positions (the row itself included).
    sliding_window: int | None
    global_theta: float
    global_scaling: dict | None
    local_theta: float
    local_scaling: dict | None
    max_position: int
    #: ``attn_logit_softcapping`` as configured; not applied (see the module invariants).
    attn_softcap: float | None
    final_softcap: float | None
    eos_token_ids: tuple[int, ...]
    #: Norm weights in the checkpoint already hold ``1 + w`` (GGUF).
    norm_offset_stored: bool = False

    def window(self, layer: int) -> int | None:
        """The attention window of ``layer`` (None: global)."""
        return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None

    @classmethod
    def from_store(cls, store: Any) -> Gemma3Dims:
        """Dims of the checkpoint behind ``store`` (GGUF metadata when it has any)."""
        meta = store.gguf_metadata if getattr(store, "format", None) == "gguf" else None
        if meta:
            return cls.from_gguf(store.config, meta)
        return cls.from_config(store.config)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Gemma3Dims:
        """Dims of an HF ``gemma3_text`` config (or a ``gemma3`` one's ``text_config``)."""
        if isinstance(config.get("text_config"), dict):
            outer_eos = config.get("eos_token_id")
            config = dict(config["text_config"])
            config.setdefault("eos_token_id", outer_eos)
        act = config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh"
        if act not in _ACTIVATIONS:
            raise ConfigError(f"gemma3: hidden_activation {act!r} is not supported (only {_ACTIVATIONS})")
        if config.get("use_bidirectional_attention"):
            raise ConfigError("gemma3: use_bidirectional_attention (embedding models) is not supported")
        if config.get("attention_bias"):
            raise ConfigError("gemma3: attention_bias is not supported")
        hidden = int(_require(config, "hidden_size"))
        heads = int(_require(config, "num_attention_heads"))
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        if heads % kv_heads or head_dim % 2:
            raise ConfigError(
                f"gemma3: {heads} heads / {kv_heads} KV heads / head_dim {head_dim} is not a valid GQA layout"
            )
        layers = int(_require(config, "num_hidden_layers"))
        g_theta, g_scaling, l_theta, l_scaling = _ropes(config)
        window = config.get("sliding_window")
        eos = config.get("eos_token_id")
        eos_ids = () if eos is None else tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
        soft = config.get("attn_logit_softcapping")
        final = config.get("final_logit_softcapping")
        return cls(
            vocab_size=int(_require(config, "vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(_require(config, "intermediate_size")),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            attn_scale=float(config.get("query_pre_attn_scalar") or head_dim) ** -0.5,
            layer_types=_layer_types(config, layers),
            sliding_window=int(window) if window is not None else None,
            global_theta=g_theta,
            global_scaling=g_scaling,
            local_theta=l_theta,
            local_scaling=l_scaling,
            max_position=int(config.get("max_position_embeddings", 131_072)),
            attn_softcap=float(soft) if soft else None,
            final_softcap=float(final) if final else None,
            eos_token_ids=eos_ids,
        )

    @classmethod
    def from_gguf(cls, config: Mapping[str, Any], meta: Mapping[str, Any]) -> Gemma3Dims:
        """Dims of a ``gemma3`` GGUF: the store's synthesized config plus the gemma3 keys."""
        arch = meta.get("general.architecture")
        if arch != "gemma3":
            raise ConfigError(f"gemma3: GGUF architecture {arch!r} is not gemma3")
        layers = int(_require(config, "num_hidden_layers"))
        head_dim = int(_require(config, "head_dim"))
        window = meta.get("gemma3.attention.sliding_window")
        eos = [config["eos_token_id"]] if config.get("eos_token_id") is not None else []
        eot = meta.get("tokenizer.ggml.eot_token_id")
        if eot is None:  # Gemma's chat turns end with <end_of_turn>, not the file's EOS
            tokens = meta.get("tokenizer.ggml.tokens") or []
            eot = next((i for i, t in enumerate(tokens) if t == "<end_of_turn>"), None)
        if eot is not None and int(eot) not in eos:
            eos.append(int(eot))
        scaling = config.get("rope_scaling") if isinstance(config.get("rope_scaling"), dict) else None
        soft = meta.get("gemma3.attn_logit_softcapping")
        final = meta.get("gemma3.final_logit_softcapping")
        pattern = int(meta.get("gemma3.attention.sliding_window_pattern") or 6)
        return cls(
            vocab_size=int(_require(config, "vocab_size")),
            hidden_size=int(_require(config, "hidden_size")),
            intermediate_size=int(_require(config, "intermediate_size")),
            num_layers=layers,
            num_heads=int(_require(config, "num_attention_heads")),
            num_kv_heads=int(_require(config, "num_key_value_heads")),
            head_dim=head_dim,
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            attn_scale=head_dim**-0.5,
            layer_types=_layer_types({"sliding_window_pattern": pattern}, layers),
            sliding_window=int(window) if window else None,
            global_theta=float(config.get("rope_theta") or _DEFAULT_GLOBAL_THETA),
            global_scaling=_scaling(scaling),
            local_theta=_DEFAULT_LOCAL_THETA,
            local_scaling=None,
            max_position=int(config.get("max_position_embeddings", 131_072)),
            attn_softcap=float(soft) if soft else None,
            final_softcap=float(final) if final else None,
            eos_token_ids=tuple(eos),
            norm_offset_stored=True,
        )
