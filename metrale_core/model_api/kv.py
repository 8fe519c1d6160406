"""The KV side of the model contract: KV and recurrent layouts, KV codecs and the paged cache.

Owner: ``metrale_core.model_api`` (which exports these names); the engine sizes its pools from a
model's :class:`KVLayout` / :class:`RecurrentLayout` and hands the model a :class:`PagedKVCache`.

Invariants:
- A page holds ``block_size`` positions of every KV head of one layer; slot ``s`` is block
  ``s // block_size``, offset ``s % block_size``.
- A :class:`KVCodec` round-trips what it stores: ``decode(encode(rows))`` is what attention reads
  (exact for :class:`PlainKVCodec`).
- Nothing here imports the engine or a model.
"""

from __future__ import annotations

from typing import Protocol

import torch
from attrs import define, field, frozen

__all__ = [
    "KVCodec",
    "KVGroup",
    "KVGroups",
    "KVLayout",
    "PagedKVCache",
    "PlainKVCodec",
    "RecurrentLayout",
    "gather_blocks",
    "zeroed_pages",
]


#: Dtype of the per-group scales of a block-quantized cache (``KVLayout.scale_group``).
SCALE_DTYPE = torch.float16


@frozen
class KVLayout:
    """Shape of the attention KV cache a model needs."""

    #: Number of attention layers that keep K/V in the paged cache.
    num_layers: int
    #: Key/value heads per layer.
    num_kv_heads: int
    #: Head dimension of keys and values.
    head_dim: int
    #: Storage dtype of the cache (the model dtype unless a KV-dtype plugin changes it).
    dtype: torch.dtype = torch.float32
    #: Last dimension of the V tensors when it differs from K's (an MLA latent cache keeps the
    #: latent in K and a per-token side cache, e.g. a sparse-attention indexer's keys, in V);
    #: None means ``head_dim``.
    v_head_dim: int | None = None
    #: Per layer, the positions a row attends back to (its own included; None: the whole
    #: context); empty: every layer is global.  Drives the KV groups (see the module docstring).
    windows: tuple[int | None, ...] = ()
    #: Values per scale of a block-quantized cache (q8_0: 32 int8 codes share one float16
    #: scale, stored beside the pages in ``PagedKVCache.k_scales`` / ``v_scales``); 0: none.
    scale_group: int = 0

    def __attrs_post_init__(self) -> None:
        if self.windows and len(self.windows) != self.num_layers:
            raise ValueError(f"KVLayout.windows names {len(self.windows)} layers, not {self.num_layers}")
        if any(w is not None and w < 1 for w in self.windows):
            raise ValueError(f"an attention window must be >= 1 position: {self.windows}")
        if self.scale_group and (self.head_dim % self.scale_group or self.v_dim % self.scale_group):
            raise ValueError(f"head sizes {self.head_dim}/{self.v_dim} are not multiples of {self.scale_group}")

    @property
    def v_dim(self) -> int:
        """Last dimension of the V tensors."""
        return self.head_dim if self.v_head_dim is None else self.v_head_dim

    @property
    def groups(self) -> KVGroups:
        """The KV groups of this layout (one group of every layer without windows)."""
        return KVGroups.of(self)

    def bytes_per_token(self) -> int:
        """Bytes of K plus V across all layers for one token."""
        return self.num_layers * self._bytes_per_layer_token()

    def bytes_per_page_token(self) -> int:
        """Bytes one token of one pool page takes: ``group_size`` layers (all layers without
        windows, so ``bytes_per_token``); the pool holds ``memory // (block_size * this)`` pages."""
        return self.groups.group_size * self._bytes_per_layer_token()

    def _bytes_per_layer_token(self) -> int:
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        values = self.head_dim + self.v_dim
        scales = values // self.scale_group * SCALE_DTYPE.itemsize if self.scale_group else 0
        return self.num_kv_heads * (values * itemsize + scales)


@frozen
class KVGroup:
    """Layers that share one block table per sequence: same window, at most ``group_size``."""

    #: The window of every layer here (None: full attention).
    window: int | None
    #: The layers, in order; layer ``layers[j]`` stores into pool tensor ``j``.
    layers: tuple[int, ...]


@frozen
class KVGroups:
    """How a layout's layers map onto block tables and pool tensors (module docstring).

    Groups are ordered full-attention first, then by window; a window's layers are cut into
    groups of ``group_size`` (the smallest per-window layer count, vLLM's rule), the last one
    possibly shorter (its unused pool tensors idle in its pages).
    """

    groups: tuple[KVGroup, ...]
    #: Layers per page: the number of K (and V) tensors the pool allocates.
    group_size: int

    @classmethod
    def of(cls, layout: KVLayout) -> KVGroups:
        n = layout.num_layers
        windows = layout.windows or (None,) * n
        if len(set(windows)) <= 1:
            return cls((KVGroup(windows[0] if n else None, tuple(range(n))),), max(n, 1))
        by_window: dict[int | None, list[int]] = {}
        for layer, window in enumerate(windows):
            by_window.setdefault(window, []).append(layer)
        size = min(len(layers) for layers in by_window.values())
        order = sorted(by_window, key=lambda w: (w is not None, w or 0))
        groups = tuple(
            KVGroup(w, tuple(by_window[w][i : i + size])) for w in order for i in range(0, len(by_window[w]), size)
        )
        return cls(groups, size)

    @property
    def windows(self) -> tuple[int | None, ...]:
        """The window of each group, in group order."""
        return tuple(g.window for g in self.groups)

    def locate(self, layer: int) -> tuple[int, int]:
        """``(group, pool tensor index)`` of ``layer``."""
        for g, group in enumerate(self.groups):
            if layer in group.layers:
                return g, group.layers.index(layer)
        raise IndexError(f"layer {layer} is in no KV group")

    def group_of_layers(self) -> tuple[int, ...]:
        """Per layer, the index of its group."""
        num_layers = sum(len(g.layers) for g in self.groups)
        return tuple(self.locate(layer)[0] for layer in range(num_layers))


@frozen
class RecurrentLayout:
    """Per-sequence recurrent state a model keeps (linear attention, conv state)."""

    #: Number of recurrent layers.
    num_layers: int
    #: Bytes of state per sequence across all recurrent layers.
    bytes_per_sequence: int


class KVCodec(Protocol):
    """How a :class:`PagedKVCache` stores K/V and reads them back (the KV-dtype seam).

    Model plugins never touch ``k``/``v`` storage directly when ``cache.plain`` is False; they
    call :meth:`PagedKVCache.write` / :meth:`PagedKVCache.gather`, which delegate here.  A
    KV-dtype plugin (FP8, ...) supplies its own codec through ``metrale_kv_scale_sources``.
    """

    #: Short name shown in logs ("plain", "fp8").
    name: str
    #: True when the storage tensors hold K/V as plain floats a kernel may read directly.
    plain: bool
    #: Storage dtype of the pool (None: the layout's dtype).
    storage_dtype: torch.dtype | None

    def write(
        self, cache: PagedKVCache, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel=None
    ) -> None:
        """Store ``k`` / ``v`` ``[T, Hk, d]`` of ``layer`` at the flat slots ``[T]``."""
        ...

    def gather(
        self, cache: PagedKVCache, layer: int, block_ids: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the blocks ``block_ids`` ``[..., nb]`` as ``[..., nb * bs, Hk, d]`` in ``dtype``."""
        ...

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
        """A fused decode kernel over this storage, or None to let the model gather and attend."""
        ...


class PlainKVCodec:
    """The default codec: K/V stored as they are (cast to the storage dtype), read back cast."""

    name: str = "plain"
    plain: bool = True
    storage_dtype: torch.dtype | None = None

    def write(
        self, cache: PagedKVCache, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel=None
    ) -> None:
        """``kernel(k, v, k_cache, v_cache, slot_mapping)`` is a model's fused store, if any."""
        k_cache, v_cache = cache.k[layer], cache.v[layer]
        if kernel is not None:
            kernel(k, v, k_cache, v_cache, slot_mapping)
            return
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, v.to(v_cache.dtype))

    def gather(
        self, cache: PagedKVCache, layer: int, block_ids: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return (gather_blocks(cache.k[layer], block_ids, dtype), gather_blocks(cache.v[layer], block_ids, dtype))

    def decode_attention(self, cache, layer, q, block_tables, context_lens, scale, max_context):
        return None


def gather_blocks(storage: torch.Tensor, block_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[..., nb * bs, H, d]`` rows of ``storage`` ``[blocks, bs, H, d]`` for ``block_ids`` ``[..., nb]``."""
    gathered = storage[block_ids]  # [..., nb, bs, H, d]
    shape = (*gathered.shape[:-4], -1, *gathered.shape[-2:])
    return gathered.reshape(shape).to(dtype)


def zeroed_pages(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """A zeroed tensor; on the CPU a private anonymous mapping, which the kernel hands out as
    zero pages committed on first write: a KV pool costs resident memory only as its blocks fill
    (as llama.cpp's does), where ``torch.zeros`` writes, and so commits, every page at start."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    import math
    import mmap

    import numpy as np

    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.from_numpy(np.frombuffer(pages, dtype=np.uint8)).view(dtype).view(shape)


@define
class PagedKVCache:
    """The paged K/V pool: one K and one V tensor per attention layer.

    ``k[layer]`` has shape ``[num_blocks, block_size, num_kv_heads, head_dim]`` and ``v[layer]``
    the same with ``KVLayout.v_dim`` last.  With KV groups (windows) ``k[layer]`` is the pool
    tensor of the layer's index in its group, shared by the same index of the other groups
    (each group writes only the pages its block tables hold).
    A token at slot ``s`` lives at ``[s // block_size, s % block_size]``.
    """

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    block_size: int
    #: Free-form per-layer extras owned by KV-dtype plugins (e.g. FP8 scales).
    extras: dict = field(factory=dict)
    #: How K/V are stored and read back (:class:`PlainKVCodec` unless a KV-dtype plugin's).
    codec: KVCodec = field(factory=PlainKVCodec)
    #: Per layer, the scales of a block-quantized cache (``KVLayout.scale_group`` > 0):
    #: ``[num_blocks, block_size, num_kv_heads, head_dim // scale_group]`` float16 beside ``k`` /
    #: ``v`` (shared by the layers sharing their page tensor); empty otherwise.
    k_scales: list[torch.Tensor] = field(factory=list)
    v_scales: list[torch.Tensor] = field(factory=list)

    @classmethod
    def allocate(
        cls,
        layout: KVLayout,
        num_blocks: int,
        block_size: int,
        device: torch.device | str = "cpu",
        codec: KVCodec | None = None,
    ) -> PagedKVCache:
        """Zeroed storage of ``layout.dtype`` (the codec's storage dtype) for ``num_blocks`` pages
        of ``layout.groups.group_size`` layers (every layer without windows), with their scales
        when ``layout.scale_group`` is set."""
        groups = layout.groups
        size = min(groups.group_size, layout.num_layers)
        index = [groups.locate(layer)[1] for layer in range(layout.num_layers)]

        def pages(width: int, dtype: torch.dtype) -> list[torch.Tensor]:
            tensors = [
                zeroed_pages((num_blocks, block_size, layout.num_kv_heads, width), dtype, device) for _ in range(size)
            ]
            return [tensors[j] for j in index]

        group = layout.scale_group
        return cls(
            k=pages(layout.head_dim, layout.dtype),
            v=pages(layout.v_dim, layout.dtype),
            block_size=block_size,
            codec=codec if codec is not None else PlainKVCodec(),
            k_scales=pages(layout.head_dim // group, SCALE_DTYPE) if group else [],
            v_scales=pages(layout.v_dim // group, SCALE_DTYPE) if group else [],
        )

    @property
    def num_blocks(self) -> int:
        return self.k[0].shape[0] if self.k else 0

    @property
    def plain(self) -> bool:
        """True when ``k[layer]`` / ``v[layer]`` hold plain floats a kernel may read directly."""
        return self.codec.plain

    def write(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, kernel=None) -> None:
        """Store ``k`` / ``v`` ``[T, Hk, d]`` of ``layer`` at flat slots ``slot_mapping`` ``[T]``.

        ``kernel(k, v, k_cache, v_cache, slot_mapping)`` is the model's own fused store; the
        plain codec uses it, other codecs (which quantize) ignore it.
        """
        self.codec.write(self, layer, slot_mapping, k, v, kernel)

    def gather(self, layer: int, block_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of ``block_ids`` ``[..., nb]`` as ``[..., nb * block_size, Hk, d]`` in ``dtype``."""
        return self.codec.gather(self, layer, block_ids, dtype)
