"""Every op the decoder uses, built once per model and device.

Owner: ``metrale_core.layers``; every decoder model holds one :class:`DecoderOps`.

Invariants: each op is built once, so its path (CUDA / C CPU / torch) is chosen once;
``prefill_attention`` exists on CPU models only (None on CUDA).
"""

from __future__ import annotations

import torch

from metrale_core.layers.kv_cache_write import KVCacheWrite
from metrale_core.layers.ops import PagedAttentionDecode, PagedAttentionPrefill
from metrale_core.layers.pointwise.norm_ops import QKNormRope, RMSNorm, SwiGLU

__all__ = ["DecoderOps"]


class DecoderOps:
    """Every op the decoder uses, built once for one device (so the path is chosen once).
    ``prefill_attention`` exists on CPU models only (None on CUDA)."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.rms_norm = RMSNorm(device)
        self.qk_norm_rope = QKNormRope(device)
        self.swiglu = SwiGLU(device)
        self.kv_write = KVCacheWrite(device)
        self.decode_attention = PagedAttentionDecode(device)
        self.prefill_attention = PagedAttentionPrefill(device) if torch.device(device).type == "cpu" else None

    def __repr__(self) -> str:
        ops = (
            self.rms_norm,
            self.qk_norm_rope,
            self.swiglu,
            self.kv_write,
            self.decode_attention,
            self.prefill_attention,
        )
        return "DecoderOps(" + ", ".join(map(repr, filter(None, ops))) + ")"
