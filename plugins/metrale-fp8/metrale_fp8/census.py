"""Checkpoint K/V scales: one key resolver, the per-layer loader and the census built on it.

Owner: ``metrale_fp8``.  :func:`load_kv_scales` is what the codec uses to give a layer its
checkpoint scale; :func:`kv_scale_census` runs that same loader over every layer the store
names, so "N layers from the checkpoint" is exactly the number of layers that load one.

Invariants:
- Spellings (relative to the attention module ``<prefix>layers.<i>.self_attn.`` /
  ``attention.`` / ``attn.``) are tried in :data:`SPELLINGS` order; the first with a K or a V
  tensor wins.  A single ``kv_scale`` serves K and V; when only one of K/V is present it serves
  both (vLLM's rule: the one valid scale is used for both).
- Every loaded scale is finite and > 0, with one element or one per KV head; anything else is a
  ``WeightsError`` naming the tensor.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from attrs import frozen

from metrale_core.api import WeightsError

__all__ = ["SPELLINGS", "KvScaleCensus", "LayerKvScales", "kv_scale_census", "load_kv_scales", "resolve_kv_scale_names"]

#: (spelling as reported, K suffix, V suffix), relative to the attention module.
SPELLINGS: tuple[tuple[str, str, str], ...] = (
    ("k_scale/v_scale", "k_scale", "v_scale"),
    ("kv_scale", "kv_scale", "kv_scale"),
    ("k_proj.output_scale", "k_proj.output_scale", "v_proj.output_scale"),
    ("k_proj.k_scale", "k_proj.k_scale", "v_proj.v_scale"),
    ("qkv_proj.{k,v}_scale", "qkv_proj.k_scale", "qkv_proj.v_scale"),
    ("attn.{k,v}_scale", "attn.k_scale", "attn.v_scale"),
    ("{k,v}_cache.scale", "k_cache.scale", "v_cache.scale"),
)
#: Attention module names under a layer prefix.
ATTENTION_MODULES: tuple[str, ...] = ("self_attn.", "attention.", "attn.")
_LAYER_RE = re.compile(r"^(?P<base>(?:.*\.)?layers\.)(?P<index>\d+)\.(?P<rest>.*scale)$")


@frozen
class ResolvedNames:
    """The tensor names one layer's scales come from."""

    spelling: str
    k_name: str | None
    v_name: str | None


@frozen
class LayerKvScales:
    """One layer's checkpoint scales (float32, ``[1]`` or ``[Hk]``) and where they came from."""

    layer: int
    k_scale: torch.Tensor
    v_scale: torch.Tensor
    spelling: str
    names: tuple[str, ...]


def resolve_kv_scale_names(names: Any, layer_prefix: str) -> ResolvedNames | None:
    """The scale tensors of the layer at ``layer_prefix`` (``"model.layers.3."``) in ``names``."""
    for module in ATTENTION_MODULES:
        attn = layer_prefix + module
        for spelling, k_suffix, v_suffix in SPELLINGS:
            k_name, v_name = attn + k_suffix, attn + v_suffix
            k_in, v_in = k_name in names, v_name in names
            if k_in or v_in:
                return ResolvedNames(spelling, k_name if k_in else None, v_name if v_in else None)
    return None


def _layer_bases(store: Any) -> list[str]:
    """Every ``...layers.`` prefix under which the store names a scale tensor."""
    bases = {m.group("base") for m in map(_LAYER_RE.match, store.names()) if m}
    return sorted(bases)


def _load_scale(store: Any, name: str, num_kv_heads: int | None) -> torch.Tensor:
    value = store.get(name, dtype=torch.float32).reshape(-1)
    if value.numel() != 1 and (num_kv_heads is None or value.numel() != num_kv_heads):
        raise WeightsError(
            f"KV scale {name!r} has {value.numel()} elements; expected 1 or one per KV head ({num_kv_heads})"
        )
    if not bool(torch.isfinite(value).all()) or not bool((value > 0).all()):
        raise WeightsError(f"KV scale {name!r} must be finite and > 0, got {value.tolist()}")
    return value


def load_kv_scales(
    store: Any, layer: int, *, num_kv_heads: int | None = None, bases: list[str] | None = None
) -> LayerKvScales | None:
    """Layer ``layer``'s checkpoint K/V scales, or None when the checkpoint ships none for it."""
    for base in bases if bases is not None else _layer_bases(store):
        resolved = resolve_kv_scale_names(store, f"{base}{layer}.")
        if resolved is None:
            continue
        k = _load_scale(store, resolved.k_name, num_kv_heads) if resolved.k_name else None
        v = _load_scale(store, resolved.v_name, num_kv_heads) if resolved.v_name else None
        names = tuple(dict.fromkeys(n for n in (resolved.k_name, resolved.v_name) if n))
        k_scale, v_scale = (k if k is not None else v), (v if v is not None else k)
        assert k_scale is not None and v_scale is not None  # a resolved layer names at least one scale
        return LayerKvScales(layer, k_scale, v_scale, resolved.spelling, names)
    return None


@frozen
class KvScaleCensus:
    """Which layers of a checkpoint load K/V scales, and under which spellings."""

    #: layer index -> its scales, for every layer that loads one.
    layers: dict[int, LayerKvScales]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def spellings(self) -> list[str]:
        """The spellings found, in :data:`SPELLINGS` order."""
        found = {s.spelling for s in self.layers.values()}
        return [spelling for spelling, _, _ in SPELLINGS if spelling in found]


def kv_scale_census(store: Any, *, num_kv_heads: int | None = None) -> KvScaleCensus:
    """Run :func:`load_kv_scales` over every layer the store names (MTP layers included)."""
    if store is None:
        return KvScaleCensus({})
    bases = _layer_bases(store)
    indices = sorted({int(m.group("index")) for m in map(_LAYER_RE.match, store.names()) if m})
    layers = {}
    for index in indices:
        scales = load_kv_scales(store, index, num_kv_heads=num_kv_heads, bases=bases)
        if scales is not None:
            layers[index] = scales
    return KvScaleCensus(layers)
