"""E4M3 (``torch.float8_e4m3fn``) quantisation with a multiplicative dequant scale.

Owner: ``metrale_fp8``; the codec (``codec.py``) and the torch oracles of the kernels use these.

Invariants:
- ``quantize(x, s) = sat_rne_e4m3(x / s)``: IEEE float32 division, round-to-nearest-even,
  saturation to ±448, so a finite or infinite input never becomes NaN (a NaN input stays NaN,
  as with CUDA's ``cvt.rn.satfinite``).
- ``dequantize(q, s) = float(q) * s``; ``s`` is a scalar or one value per KV head (``[Hk]``),
  broadcast over ``[..., Hk, d]``.
- ``scale_from_amax(amax, headroom) = max(amax * headroom / 448, float32 eps)``.
"""

from __future__ import annotations

import torch

__all__ = ["FP8_DTYPE", "FP8_MAX", "dequantize", "quantize", "scale_from_amax"]

#: Storage dtype of FP8 KV blocks.
FP8_DTYPE = torch.float8_e4m3fn
#: Largest finite E4M3FN magnitude.
FP8_MAX = 448.0
_MIN_SCALE = torch.finfo(torch.float32).eps


def _per_head(scale: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``scale`` (``[]`` or ``[Hk]``) shaped to broadcast over ``x`` ``[..., Hk, d]``."""
    scale = scale.to(device=x.device, dtype=torch.float32)
    return scale if scale.dim() == 0 else scale.view(-1, 1)


def quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x`` ``[..., Hk, d]`` -> E4M3 codes of ``x / scale``, saturated to ±448."""
    return (x.float() / _per_head(scale, x)).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """E4M3 codes ``q`` ``[..., Hk, d]`` -> ``float(q) * scale`` in ``dtype``."""
    return (q.float() * _per_head(scale, q)).to(dtype)


def scale_from_amax(amax: float, headroom: float) -> float:
    """The dequant scale that maps ``amax * headroom`` onto 448."""
    return max(float(amax) * float(headroom) / FP8_MAX, _MIN_SCALE)
