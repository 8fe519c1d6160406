"""``Fp8KVCodec``: E4M3 K/V storage with per-layer scales (the ``PagedKVCache`` codec for fp8).

Owner: ``metrale_fp8``; built by ``build.build_codec`` and called through
``PagedKVCache.write`` / ``gather`` (and ``decode_attention`` on CUDA) by model plugins.

Invariants:
- Storage is ``torch.float8_e4m3fn``; a write stores ``sat_rne_e4m3(x / scale)`` (never NaN from
  a finite or infinite input), a read returns ``code * scale`` in the caller's dtype.  Scales are
  per layer for K and for V (float32 ``[Hk]``, one value repeated unless a checkpoint ships one
  per head).
- ``sources[layer]`` is "checkpoint", "calibration" or "unit" (1.0).
- While a layer's calibration window is open (``calibrations[layer]`` not None) its rows are held
  at model precision and read back unquantized; at the freeze every held row is requantized with
  the frozen scale and written to the FP8 storage, so the write scale is the read scale.
  ``paused()`` stops counting and observing (warm-ups with uninitialised recurrent state) while
  still holding the rows.
- Layers sharing a pool tensor (the KV groups of a model with attention windows): a write by one
  makes the others' open windows forget their held rows at those slots, so a freeze never
  writes a stale row over another group's page.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from loguru import logger

from metrale_core.api import PagedKVCache, gather_blocks
from metrale_fp8.calibration import LayerCalibration
from metrale_fp8.e4m3 import FP8_DTYPE, dequantize, scale_from_amax
from metrale_fp8.ops import Fp8Ops

__all__ = ["Fp8KVCodec"]


class Fp8KVCodec:
    """See the module docstring."""

    name = "fp8"
    plain = False
    storage_dtype = FP8_DTYPE

    def __init__(
        self,
        num_kv_heads: int,
        k_scales: Sequence[torch.Tensor],
        v_scales: Sequence[torch.Tensor],
        sources: Sequence[str],
        *,
        calibration_tokens: int = 0,
        headroom: float = 2.0,
        device: torch.device | str = "cpu",
        ops: Fp8Ops | None = None,
        source: object = None,
    ) -> None:
        #: The start-up classification (``scale_source.Calibration`` / ``Checkpoint`` / ...).
        self.source = source
        self.device = torch.device(device)
        self.num_kv_heads = num_kv_heads
        self.k_scales = [self._heads(s) for s in k_scales]
        self.v_scales = [self._heads(s) for s in v_scales]
        self.sources = list(sources)
        self.headroom = headroom
        self.calibration_tokens = calibration_tokens
        self.calibrations: list[LayerCalibration | None] = [
            LayerCalibration(calibration_tokens) if calibration_tokens > 0 else None for _ in self.sources
        ]
        #: Tokens each layer observed before its freeze (for metrics); None while open / unused.
        self.frozen_after: list[int | None] = [None] * len(self.sources)
        self.ops = ops if ops is not None else Fp8Ops(self.device)
        self._observing = True
        #: The cache ``_shared`` was computed for, and per layer the layers sharing its storage.
        self._shared_for: PagedKVCache | None = None
        self._shared: list[tuple[int, ...]] = []

    def _heads(self, scale: torch.Tensor | float) -> torch.Tensor:
        s = torch.as_tensor(scale, dtype=torch.float32).reshape(-1).to(self.device)
        return s.expand(self.num_kv_heads).contiguous() if s.numel() == 1 else s.contiguous()

    def __repr__(self) -> str:
        return f"Fp8KVCodec(layers={len(self.sources)}, open windows={self.num_open_windows})"

    @property
    def num_open_windows(self) -> int:
        return sum(c is not None for c in self.calibrations)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Writes inside are held (if calibrating) but neither counted nor observed."""
        previous, self._observing = self._observing, False
        try:
            yield
        finally:
            self._observing = previous

    # --- the codec contract ------------------------------------------------------------------
    def write(
        self, cache: PagedKVCache, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel=None
    ) -> None:
        for other in self._sharing(cache, layer):
            open_window = self.calibrations[other]
            if open_window is not None:
                open_window.forget(slot_mapping)
        calibration = self.calibrations[layer]
        if calibration is None:
            self.ops.write(
                k, v, cache.k[layer], cache.v[layer], slot_mapping, self.k_scales[layer], self.v_scales[layer]
            )
            return
        calibration.hold(cache.num_blocks * cache.block_size, slot_mapping, k, v)
        if self._observing:
            calibration.observe(k, v)
            if calibration.ready:
                self._freeze(cache, layer, calibration)

    def gather(
        self, cache: PagedKVCache, layer: int, block_ids: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        k = dequantize(gather_blocks(cache.k[layer], block_ids, FP8_DTYPE), self.k_scales[layer], dtype)
        v = dequantize(gather_blocks(cache.v[layer], block_ids, FP8_DTYPE), self.v_scales[layer], dtype)
        calibration = self.calibrations[layer]
        if calibration is not None:
            calibration.overlay(block_ids, cache.block_size, k, v)
        return k, v

    def decode_attention(
        self,
        cache: PagedKVCache,
        layer: int,
        q: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        scale: float,
        max_context: int,
    ) -> torch.Tensor | None:
        if not self.ops.fused or self.calibrations[layer] is not None:
            return None
        return self.ops.decode(
            q,
            cache.k[layer],
            cache.v[layer],
            self.k_scales[layer],
            self.v_scales[layer],
            block_tables,
            context_lens,
            scale,
            max_context,
        )

    def _sharing(self, cache: PagedKVCache, layer: int) -> tuple[int, ...]:
        """The other layers whose storage is ``layer``'s (KV groups of a windowed model share
        pool tensors; none otherwise), computed once per cache."""
        if self._shared_for is not cache:
            self._shared_for = cache
            self._shared = [
                tuple(j for j in range(len(cache.k)) if j != i and cache.k[j] is cache.k[i])
                for i in range(len(cache.k))
            ]
        return self._shared[layer]

    # --- calibration -------------------------------------------------------------------------
    def _freeze(self, cache: PagedKVCache, layer: int, calibration: LayerCalibration) -> None:
        k_amax, v_amax = calibration.amax()
        k_scale, v_scale = scale_from_amax(k_amax, self.headroom), scale_from_amax(v_amax, self.headroom)
        self.k_scales[layer] = self._heads(k_scale)
        self.v_scales[layer] = self._heads(v_scale)
        self.calibrations[layer] = None
        self.frozen_after[layer] = calibration.observed
        if calibration.staged_slots is not None and calibration.staged_slots.numel():
            assert calibration.staged_k is not None and calibration.staged_v is not None  # staged together
            live = calibration.live()
            self.ops.write(
                calibration.staged_k[live],
                calibration.staged_v[live],
                cache.k[layer],
                cache.v[layer],
                calibration.staged_slots[live],
                self.k_scales[layer],
                self.v_scales[layer],
            )
        logger.info(
            "FP8 KV scales frozen after {} tokens (requested {}) on layer {}: "
            "k_scale {:.6g} (amax {:.6g}), v_scale {:.6g} (amax {:.6g})",
            calibration.observed,
            calibration.window,
            layer,
            k_scale,
            k_amax,
            v_scale,
            v_amax,
        )

    # --- read-outs ---------------------------------------------------------------------------
    def layer_report(self) -> list[dict]:
        """Per layer: source, frozen flag and the current K/V scales (max over heads)."""
        return [
            {
                "layer": i,
                "source": src,
                "frozen": self.calibrations[i] is None,
                "k_scale": float(self.k_scales[i].max()),
                "v_scale": float(self.v_scales[i].max()),
                "frozen_after": self.frozen_after[i],
            }
            for i, src in enumerate(self.sources)
        ]
