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
        else:
            self.inv_freq = rope_inv_freq(dims.rotary_dim, dims.rope_theta, dims.rope_scaling).to(device)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``[T, rotary_dim]`` cos and sin in ``dtype`` for int positions ``[T]``."""
        if self.long is None:
            return rope_cos_sin(positions, self.inv_freq, dtype)
        pos = positions.float()[:, None]
        freqs = torch.where(positions[:, None] >= self.original, pos * self.long[None, :], pos * self.inv_freq[None, :])
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.attention).to(dtype), (emb.sin() * self.attention).to(dtype)
