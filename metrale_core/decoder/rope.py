"""RoPE tables of a decoder definition: cos/sin per row, LongRoPE and partial rotary dimensions.

Owner: ``metrale_core.decoder``; ``model.DecoderLM`` builds one :class:`RopeTables` per model and
asks it for ``(cos, sin)`` once per forward.

Invariants:
- Kinds default / linear / llama3: exactly ``rope_cos_sin(positions, rope_inv_freq(...))`` (the
  Llama path, op for op).
- ``longrope`` (Phi-3.5 / Phi-4-mini, transformers' ``_compute_longrope_parameters``): inverse
  frequencies ``1 / (factors * base ** (2j / dim))`` with the short factors, and the long ones for
  a row at position ``p >= original_max_position_embeddings``; cos and sin are multiplied by the
  attention factor (``attention_factor``, else ``sqrt(1 + ln(factor) / ln(original))`` with
  ``factor`` = the configured one, else ``max_position / original``; 1 when ``factor <= 1``) in
  float32 before the cast.  The choice is per row, by its own position, so a cached key keeps the
  rotation it was written with whatever the batching or chunking: this equals transformers'
  ``generate`` whenever the prompt fits the original length (its decode steps switch to the long
  factors at the same position); a prompt longer than that is rotated by position here, where
  transformers rotates the whole prompt with the long factors.
- ``yarn`` (gpt-oss, DeepSeek; transformers' ``_compute_yarn_parameters``): inverse frequencies blended
  between ``1 / base ** (2j / dim)`` and that divided by ``factor`` by a linear ramp over the
  correction range of ``beta_fast`` / ``beta_slow`` (default 32 / 1) rotations at
  ``original_max_position_embeddings`` (floored / ceiled unless ``truncate`` is false, as
  gpt-oss's config says), cos and sin times ``attention_factor`` (else ``0.1 ln(factor) + 1``, or
  the ``mscale`` / ``mscale_all_dim`` ratio) in float32 before the cast.
- ``freq_factors`` (a GGUF's ``rope_freqs.weight``: llama.cpp's converter writes Llama 3.1's
  llama3 scaling so): inverse frequencies ``1 / (factors * base ** (2j / dim))``, llama.cpp's
  ``theta / freq_factor``, no attention factor.
- Tables are ``[T, rotary_dim]``; ``rotary_dim < head_dim`` rotates only the leading dimensions
  of each head (``partial_rotary_factor``, transformers' ``q[..., :rotary_dim]``).
"""

from __future__ import annotations

import math

import torch

from metrale_core.decoder.dims import DecoderDims
from metrale_core.errors import ConfigError
from metrale_core.layers import rope_cos_sin, rope_inv_freq

__all__ = ["RopeTables"]


class RopeTables:
    """The rotation of one model; see the module docstring."""

    def __init__(self, dims: DecoderDims, device: torch.device) -> None:
        scaling = dims.rope_scaling or {}
        self.long: torch.Tensor | None = None
        #: cos / sin multiplier (longrope's and yarn's attention factor; 1: none).
        self.attention = 1.0
        if scaling.get("rope_type", scaling.get("type")) == "longrope":
            original = scaling.get("original_max_position_embeddings") or dims.original_max_position
            if not original:
                raise ConfigError("longrope needs original_max_position_embeddings")
            self.original = int(original)
            dim = dims.rotary_dim
            shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
            factors = {}
            for kind in ("short_factor", "long_factor"):
                values = scaling.get(kind)
                if values is None or len(values) != dim // 2:
                    raise ConfigError(f"longrope: {kind} must list {dim // 2} factors, not {values!r}")
                factors[kind] = 1.0 / (torch.tensor(values, dtype=torch.float32) * dims.rope_theta**shape)
            self.inv_freq = factors["short_factor"].to(device)
            self.long = factors["long_factor"].to(device)
            factor = scaling.get("factor") or dims.max_position / self.original
            attention = scaling.get("attention_factor")
            if attention is None:
                attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(self.original))
            self.attention = float(attention)
        elif scaling.get("rope_type") == "freq_factors":
            dim = dims.rotary_dim
            values = scaling.get("factors")
            if values is None or len(values) != dim // 2:
                raise ConfigError(f"rope freq_factors must list {dim // 2} divisors, not {values!r}")
            shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
            self.inv_freq = (1.0 / (torch.tensor(values, dtype=torch.float32) * dims.rope_theta**shape)).to(device)
        elif scaling.get("rope_type", scaling.get("type")) == "yarn":
            inv_freq, self.attention = _yarn(dims, scaling)
            self.inv_freq = inv_freq.to(device)
        else:
            self.inv_freq = rope_inv_freq(dims.rotary_dim, dims.rope_theta, dims.rope_scaling).to(device)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``[T, rotary_dim]`` cos and sin in ``dtype`` for int positions ``[T]``."""
        if self.long is None and self.attention == 1.0:
            return rope_cos_sin(positions, self.inv_freq, dtype)
        if self.long is None:
            cos, sin = rope_cos_sin(positions, self.inv_freq, torch.float32)
            return (cos * self.attention).to(dtype), (sin * self.attention).to(dtype)
        pos = positions.float()[:, None]
        freqs = torch.where(positions[:, None] >= self.original, pos * self.long[None, :], pos * self.inv_freq[None, :])
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.attention).to(dtype), (emb.sin() * self.attention).to(dtype)


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(dims: DecoderDims, scaling: dict) -> tuple[torch.Tensor, float]:
    """YaRN's inverse frequencies and attention factor (module docstring)."""
    original = scaling.get("original_max_position_embeddings") or dims.original_max_position
    if not original:
        raise ConfigError("yarn needs original_max_position_embeddings")
    dim, base = dims.rotary_dim, dims.rope_theta
    factor = float(scaling.get("factor") or dims.max_position / original)
    attention = scaling.get("attention_factor")
    if attention is None:
        mscale, all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention = _mscale(factor, mscale) / _mscale(factor, all_dim) if mscale and all_dim else _mscale(factor)
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention)
