"""Torch reference maths of the decoder layers (the oracle for every kernel in ``kernels/``).

Owner: ``metrale_core.layers``; the ``forward_native`` of each op in ``norm_ops.py`` calls these, and
model plugins call them directly where no op is needed.

Invariants (HF transformers semantics, see specs §1.3-1.4):
- RMSNorm normalises in float32 and casts back to the input dtype *before* multiplying by the
  weight (``cast="input"``, HF Llama / Qwen3 / GLM); ``cast="weight"`` casts to the weight's dtype
  instead (the MTP head's norms, as DeepSeek-style MTP code writes it).  The two agree whenever
  input and weight share a dtype; the choice is explicit so no caller's numerics change silently.
  ``unit_offset=True`` is Gemma's ``(1 + w)`` norm, multiplied in float32 and cast last.
- RoPE is the non-interleaved "rotate_half" form; ``inv_freq`` and ``pos * inv_freq`` are float32,
  cos/sin are cast to the activation dtype before they are applied.
- SwiGLU / GeGLU take the fused ``[gate | up]`` projection and return ``act(gate) * up``
  (``silu``; GeGLU: ``gelu`` with the tanh approximation, as Gemma's ``gelu_pytorch_tanh``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

import torch
import torch.nn.functional as F

from metrale_core.errors import ConfigError

__all__ = ["apply_rope", "geglu", "rms_norm", "rope_cos_sin", "rope_inv_freq", "signed_sin", "swiglu"]


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    cast: Literal["input", "weight"] = "input",
    unit_offset: bool = False,
) -> torch.Tensor:
    """``weight * cast(x32 * rsqrt(mean(x32^2) + eps), x.dtype)`` over the last dimension
    (``cast="weight"``: cast to ``weight.dtype`` instead; see the module invariants).

    ``unit_offset``: the Gemma form ``cast(x32 * rsqrt(...) * (1 + weight32), x.dtype)``, the
    weight stored as an offset from 1 and applied in float32 before the cast (``cast`` unused)."""
    if unit_offset:
        if x.dtype == torch.float32:
            return F.rms_norm(x, weight.shape, 1.0 + weight.float(), eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        return (x32 * (1.0 + weight.float())).to(x.dtype)
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)  # one fused call, bit-identical in float32
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    if cast == "weight":
        return x32.to(weight.dtype) * weight
    return weight * x32.to(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: Mapping | None = None) -> torch.Tensor:
    """``[head_dim/2]`` float32 inverse frequencies for rope types default, linear and llama3."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    scaling = scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = scaling["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    raise ConfigError(f"rope type {kind!r} is not supported (supported: default, linear, llama3)")


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[T, head_dim]`` cos and sin in ``dtype`` for int positions ``[T]`` (halves identical)."""
    freqs = positions.float()[:, None] * inv_freq.to(positions.device)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sin_signed: torch.Tensor | None = None
) -> torch.Tensor:
    """Rotate ``x`` ``[T, H, d]`` by ``cos``/``sin`` ``[T, d]``: ``x*cos + rotate_half(x)*sin``.

    Computed as ``x*cos + roll(x, d/2) * signed_sin(sin)`` (the sign moved from ``x`` onto
    ``sin``, which is exact), so every head costs one roll and no concatenation; pass
    ``sin_signed`` when it is already computed."""
    if sin_signed is None:
        sin_signed = signed_sin(sin)
    return x * cos[:, None, :] + torch.roll(x, x.shape[-1] // 2, dims=-1) * sin_signed[:, None, :]


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """``[-sin_lo | sin_hi]``: the ``sin`` table with the sign of ``rotate_half`` folded in."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up = [gate | up]`` along the last dimension."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def geglu(gate_up: torch.Tensor) -> torch.Tensor:
    """``gelu_tanh(gate) * up`` for ``gate_up = [gate | up]`` along the last dimension."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up
