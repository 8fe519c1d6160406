"""``Q8KVCodec``: the core's q8_0 KV storage (``--kv-cache-dtype q8_0``, llama.cpp's
``-ctk q8_0 -ctv q8_0``), the ``PagedKVCache`` codec that quantizes on write and whose decode and
prefill attention read the codes directly.

Owner: ``metrale_core.layers``; the core registers :func:`q8_0_source` as the built-in KV-scale
source ``q8_0`` (``plugin.builtins``), so ``engine.kv_dtype.resolve_kv_storage`` builds the codec
and its layout (:meth:`Q8KVCodec.storage_layout`) like a plugin's; model plugins reach it
through ``PagedKVCache.write`` / ``gather`` and ``attention.paged_attention``.

Invariants:
- Storage: ``cache.k[layer]`` / ``v[layer]`` hold int8 codes of the KV shape and
  ``cache.k_scales[layer]`` / ``v_scales[layer]`` one float16 scale per (position, head,
  32-group) (``KVLayout.scale_group`` = 32, so the pool counts both: 34 bytes per 32 values,
  1.88x the tokens of a bfloat16 pool and 3.76x of a float32 one).  float16, not float32, as
  llama.cpp's ``block_q8_0``: a 127-step code's relative error (<= 0.4 %) dwarfs float16's
  (<= 0.05 %), and float32 scales would cost 6 % more memory.
- ``gather`` returns the dequantized values, which is what every attention path reads: the
  fused decode / prefill kernels (``kv_q8_ops``) give the bits of the float32 kernels over them.
- Windowed, soft-capped and sink layers (``window_attention``, ``attends_windows``) go through
  the same C kernels where they take the inputs (``cpu_takes``), reading no block before a row's
  window; elsewhere ``decode_attention`` returns None and ``prefill_attention`` False, and
  ``window_attention`` attends them over ``gather``.
- Pages move only by block id (prefix caching shares them, preemption frees them): a position's
  codes and scales sit at the same (block, offset) in their tensors.
"""

from __future__ import annotations

import attrs
import torch

from metrale_core.errors import ConfigError
from metrale_core.layers.kv_q8_ops import GROUP, Q8Ops, Q8Storage, gather_q8_0
from metrale_core.model_api import KVLayout, PagedKVCache

__all__ = ["Q8KVCodec", "q8_0_layout", "q8_0_source"]


def q8_0_layout(layout: KVLayout, device: torch.device) -> KVLayout:
    """``layout`` stored as q8_0, or a ``ConfigError`` where q8_0 is not served."""
    if device.type != "cpu":
        raise ConfigError(f"--kv-cache-dtype q8_0 is served on the CPU only (this model runs on {device})")
    if layout.head_dim % GROUP or layout.v_dim % GROUP:
        raise ConfigError(
            f"--kv-cache-dtype q8_0 needs head sizes that are multiples of {GROUP}; this model's K/V heads "
            f"are {layout.head_dim}/{layout.v_dim}"
        )
    return attrs.evolve(layout, dtype=torch.int8, scale_group=GROUP)


def q8_0_source(request) -> Q8KVCodec | None:
    """The KV-scale source factory: a codec for ``request`` (an ``engine.kv_dtype.KVCodecRequest``)
    when it asks for q8_0 and the model's layout and device take it (``ConfigError`` if not)."""
    if request.kv_cache_dtype != "q8_0":
        return None
    q8_0_layout(request.layout, request.device)
    return Q8KVCodec(request.device)


class Q8KVCodec:
    """See the module docstring."""

    name = "q8_0"
    plain = False
    #: ``decode_attention`` / ``prefill_attention`` take ``window`` / ``sinks`` / ``softcap``
    #: (``window_attention`` routes windowed, soft-capped and sink layers through them).
    attends_windows = True
    storage_dtype = torch.int8

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.ops = Q8Ops(self.device)

    def storage_layout(self, layout: KVLayout) -> KVLayout:
        """``layout`` stored by this codec: int8 codes and their scales."""
        return q8_0_layout(layout, self.device)

    def __repr__(self) -> str:
        return f"Q8KVCodec(path={self.ops.decode.path})"

    @staticmethod
    def _storage(cache: PagedKVCache, layer: int) -> Q8Storage:
        return cache.k[layer], cache.k_scales[layer], cache.v[layer], cache.v_scales[layer]

    def write(
        self, cache: PagedKVCache, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel=None
    ) -> None:
        self.ops.write(k, v, *self._storage(cache, layer), slot_mapping)

    def gather(
        self, cache: PagedKVCache, layer: int, block_ids: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        k_codes, k_scales, v_codes, v_scales = self._storage(cache, layer)
        return gather_q8_0(k_codes, k_scales, block_ids, dtype), gather_q8_0(v_codes, v_scales, block_ids, dtype)

    def decode_attention(
        self,
        cache: PagedKVCache,
        layer: int,
        q: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        scale: float,
        max_context: int,
        window: int | None = None,
        sinks: torch.Tensor | None = None,
        softcap: float | None = None,
    ) -> torch.Tensor | None:
        """The decode rows ``q``; with a ``window``, ``sinks`` or ``softcap`` (``window_attention``'s)
        only through the C kernel, which reads no block outside a row's window: None where it does
        not take the inputs (the caller's own windowed path then attends them)."""
        storage = self._storage(cache, layer)
        windowed = window is not None or sinks is not None or softcap is not None
        if windowed and not self.ops.decode.cpu_takes(q, storage, block_tables, context_lens):
            return None
        return self.ops.decode(q, storage, block_tables, context_lens, scale, max_context, window, sinks, softcap)

    def prefill_attention(
        self,
        cache: PagedKVCache,
        layer: int,
        out: torch.Tensor,
        q: torch.Tensor,
        block_tables: torch.Tensor,
        segments: tuple[tuple[int, int, int, int], ...],
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> bool:
        """The multi-row ``segments`` (``AttentionPlan.multi_row``) of ``q`` into ``out``; True when
        attended.  With a ``window``, ``softcap`` or ``sinks`` only through the C kernel (False
        where it does not take the inputs, as :meth:`decode_attention`)."""
        storage = self._storage(cache, layer)
        windowed = window is not None or sinks is not None or softcap is not None
        if windowed and not self.ops.prefill.cpu_takes(out, q, storage, block_tables):
            return False
        self.ops.prefill(out, q, storage, block_tables, segments, scale, window, softcap, sinks)
        return True
