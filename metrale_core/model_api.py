"""The model contract: what a model plugin implements and what the engine hands it.

Owner: the model runner (``metrale_core.engine.runner``) builds a :class:`ForwardBatch` from the
scheduler's plan and calls :meth:`CausalLM.forward`; model plugins implement :class:`CausalLM`.

A forward runs over one flat batch of *rows* (tokens) that mixes prefill chunks, single-token
decode rows and multi-token verify rows of several sequences.  Sequence ``i`` owns rows
``query_start[i] : query_start[i+1]``; its rows sit at absolute positions
``context_lens[i] - num_rows_i ... context_lens[i] - 1``.  Before attention, the model writes the
K/V of every row into the paged cache at ``slot_mapping`` (``block * block_size + offset``), then
each row attends causally to all cached positions of its own sequence (the prefix already in the
cache plus the rows of this step up to itself), reading through ``block_tables[i]``.

Invariants:
- ``forward`` returns float32 logits for exactly the rows listed in ``logits_rows``, in order.
- The engine never asks a model that declares recurrent layers to consume a position twice:
  ``state_fresh[i]`` is True exactly when sequence ``i`` starts at position 0, in which case the
  model must reset the recurrent state in ``state_slots[i]`` before consuming.  The one
  exception is speculative verify, below: rejected rows are rolled back by ``commit_verify``
  before their positions are fed again.

Optional extensions (the engine checks with ``hasattr``):
- Speculative verify (``verify_host[i]`` True): sequence ``i``'s rows are ``[last, d1..dk]``;
  all k+1 rows ask for logits.  Attention K/V of rejected rows is discarded by the engine
  (rolling back the sequence length).  A model with recurrent state must implement
  ``commit_verify(state, slots, num_kept)``: the engine calls it once after every forward that
  had verify rows, before the next forward, for each still-running verify sequence (state slot
  ``slots[j]``); afterwards that slot's state must equal the state after consuming only the
  first ``num_kept[j]`` rows (1..k+1) of its verify chunk, bit for bit, as if the rest had never
  been fed.  Keeping per-row snapshots during a verify forward (vLLM/SGLang) or a checkpoint
  plus replay of the kept rows (the Rust KDA engine) both satisfy it.  Without
  ``commit_verify`` a recurrent model cannot be speculated on (``ConfigError``).
- ``forward_with_hidden(batch, kv, state) -> (logits, hidden)``: like ``forward`` and also the
  final-normed hidden states ``[T, D]`` of every row (MTP draft heads read them).
- ``lora_targets() -> LoRATargets`` (``metrale_core.layers.lora_targets``, protocol
  ``LoRATargetsLM``): the projections a LoRA adapter may wrap, each by its path from the model and
  the checkpoint module paths it fuses.  ``attach_lora`` wraps exactly these; a model without it
  takes no adapter (``ConfigError``).  Every model on the decoder definition has it.
- Nothing here imports a model plugin; plugins import this module.

Attention windows and KV groups.  A model may declare per-layer attention windows
(``KVLayout.windows``: Gemma 2/3 sliding layers, Mistral-style models).  The cache then splits
its layers into :class:`KVGroups`, the design of vLLM v1's hybrid KV cache manager: layers of
one window form groups of ``group_size`` layers each, every group has its own block table per
sequence, and all groups share ONE pool of pages.  A page (a block id) holds ``block_size``
tokens of ``group_size`` layers, so the pool is ``group_size`` K (and V) tensors and layer ``l``
stores into tensor ``index_of(l)`` through its group's block table (``kv.k[l]`` is that tensor,
shared with the layers of the same index in the other groups).  The block manager frees a
windowed group's blocks once they slid out of the window and hands them to any group.  Why
this design: it is the simplest one in which freed window blocks become memory the global
layers can use (a fixed split between a "global" and a "window" pool would strand one of them),
and with no window every layer is in one group of ``num_layers`` layers: pages, tables and
tensors are exactly those of the plain cache, so non-windowed models see no change.  A model
with windows reads group ``g``'s tables and slots through ``batch.for_group(g)``.

Tensor parallelism (``--tensor-parallel-size N``, :mod:`metrale_core.layers.parallel`): a loader
declares it with ``ModelLoaderSpec(tensor_parallel=True)``; the core refuses N > 1 for any other
loader (with its ``tensor_parallel_note``).  Such a loader receives this rank's group in
``LoadOptions.tensor_parallel`` (a ``TensorParallel``; None or ``world == 1`` without TP) and
builds the rank's shard, by using the shared layers:

- wrap the weight store in ``ShardedStore(store, {tensor name: Shard(dim, start, size)},
  weight_format)`` and read every projection through it with ``build_linear`` /
  ``build_embedding`` as usual: column-parallel tensors (q/k/v, gate/up, the vocabulary rows of the
  embedding and head, and their biases) are split on dim 0, row-parallel ones (o_proj, down_proj)
  on dim 1; ``split_heads`` gives the rank's query / KV heads (whole GQA groups, or a copy of one
  KV head when ranks outnumber them), ``split_range`` / ``split_unit`` the rest, on quantization
  block boundaries; a split that cuts a block is a ``ShapeMismatch`` naming the tensor;
- wrap the row-parallel projections in ``RowParallelLinear`` (its bias added once, after the
  all-reduce), the embedding in ``VocabParallelEmbedding`` and the head in ``ParallelHead``;
- report this rank's KV heads in ``info.kv`` (the engine allocates every rank's cache shard from
  it) and the whole vocabulary in ``info.vocab_size``; only rank 0's logits need be whole.

Every rank runs the same ``forward`` on the same ``ForwardBatch`` (rank 0 broadcasts it), so the
forward must enter the same collectives in the same order on every rank.
``metrale_core.decoder.weights.shard_plan`` is the worked example (with a mixture of experts:
``metrale_core.decoder.moe_weights.MoeSplit``).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from attrs import define, evolve, field, frozen

__all__ = [
    "CausalLM",
    "ForwardBatch",
    "HiddenStatesLM",
    "KVCodec",
    "KVGroup",
    "KVGroups",
    "KVLayout",
    "ModelInfo",
    "PagedKVCache",
    "PlainKVCodec",
    "RecurrentLayout",
    "VerifyCommitLM",
    "gather_blocks",
    "zeroed_pages",
]


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

    def __attrs_post_init__(self) -> None:
        if self.windows and len(self.windows) != self.num_layers:
            raise ValueError(f"KVLayout.windows names {len(self.windows)} layers, not {self.num_layers}")
        if any(w is not None and w < 1 for w in self.windows):
            raise ValueError(f"an attention window must be >= 1 position: {self.windows}")

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
        return self.num_kv_heads * (self.head_dim + self.v_dim) * itemsize


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


@frozen
class ModelInfo:
    """What the engine must know about a loaded model to size pools and schedule it."""

    #: Registered architecture name, e.g. ``"qwen3"`` or ``"llama"``.
    architecture: str
    #: Size of the logits' last dimension.
    vocab_size: int
    #: Longest sequence (prompt + output) the model supports.
    max_position: int
    #: Attention KV layout, or None for a model with no attention layers.
    kv: KVLayout | None
    #: Recurrent state layout, or None for a pure-attention model.
    recurrent: RecurrentLayout | None = None
    #: Token ids that end generation unless ``ignore_eos``.
    eos_token_ids: tuple[int, ...] = ()
    #: Activation / weight dtype of the forward.
    dtype: torch.dtype = torch.float32

    @property
    def has_recurrent_state(self) -> bool:
        """True when a step cannot be re-run: the state advances with every consumed token."""
        return self.recurrent is not None and self.recurrent.num_layers > 0


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
        of ``layout.groups.group_size`` layers (every layer without windows)."""
        shape = (num_blocks, block_size, layout.num_kv_heads, layout.head_dim)
        v_shape = (num_blocks, block_size, layout.num_kv_heads, layout.v_dim)
        groups = layout.groups
        size = min(groups.group_size, layout.num_layers)
        k = [zeroed_pages(shape, layout.dtype, device) for _ in range(size)]
        v = [zeroed_pages(v_shape, layout.dtype, device) for _ in range(size)]
        index = [groups.locate(layer)[1] for layer in range(layout.num_layers)]
        return cls(
            k=[k[j] for j in index],
            v=[v[j] for j in index],
            block_size=block_size,
            codec=codec if codec is not None else PlainKVCodec(),
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


@frozen
class ForwardBatch:
    """One model step over a flat batch of rows; see the module docstring for the layout.

    All tensors live on the model's device.  ``B`` is the number of sequences, ``T`` the number
    of rows (tokens) and ``N`` the number of rows whose logits are wanted.
    """

    #: ``[T]`` int64 token ids to consume.
    input_ids: torch.Tensor
    #: ``[T]`` int64 absolute positions of the rows.
    positions: torch.Tensor
    #: ``[B+1]`` int64 cumulative row offsets: sequence ``i`` owns rows ``query_start[i]:query_start[i+1]``.
    query_start: torch.Tensor
    #: ``[B]`` int64 tokens in the cache for each sequence after this step's rows are written.
    context_lens: torch.Tensor
    #: ``[B, max_blocks]`` int64 physical block ids of each sequence (padding is 0, never read).
    block_tables: torch.Tensor
    #: ``[T]`` int64 flat cache slot (``block * block_size + offset``) each row's K/V is written to.
    slot_mapping: torch.Tensor
    #: ``[N]`` int64 indices into the rows whose logits ``forward`` returns.
    logits_rows: torch.Tensor
    #: ``[B]`` int64 recurrent-state slot of each sequence (-1 when the model keeps no state).
    state_slots: torch.Tensor
    #: ``[B]`` bool: sequence starts at position 0, so its recurrent state starts fresh.
    state_fresh: torch.Tensor
    #: Host-side copies for Python control flow (no device sync needed).
    query_lens_host: tuple[int, ...]
    context_lens_host: tuple[int, ...]
    #: Block size of the cache the block tables index.
    block_size: int
    #: Per sequence: its rows are a speculative verify chunk (see the module docstring).
    verify_host: tuple[bool, ...] = ()
    #: KV groups after the first (``KVLayout.groups``; empty without windows): each group's
    #: ``[B, max_blocks]`` block tables (a block that slid out of the window reads as 0, never
    #: attended) and ``[T]`` slots; group 0's are ``block_tables`` / ``slot_mapping``.
    group_block_tables: tuple[torch.Tensor, ...] = ()
    group_slot_mappings: tuple[torch.Tensor, ...] = ()

    def for_group(self, group: int) -> ForwardBatch:
        """This batch as KV group ``group``'s layers see it (its block tables and slots)."""
        if group == 0:
            return self
        return evolve(
            self,
            block_tables=self.group_block_tables[group - 1],
            slot_mapping=self.group_slot_mappings[group - 1],
            group_block_tables=(),
            group_slot_mappings=(),
        )

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens_host)

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def is_pure_decode(self) -> bool:
        """Every sequence feeds exactly one row (the batched decode fast path)."""
        return all(n == 1 for n in self.query_lens_host)


@runtime_checkable
class CausalLM(Protocol):
    """A loaded model. Built by a model-loader plugin's factory."""

    info: ModelInfo

    def forward(self, batch: ForwardBatch, kv: PagedKVCache | None, state: object | None = None) -> torch.Tensor:
        """Consume ``batch``, writing K/V (and advancing recurrent state in ``state``).

        Returns ``[N, vocab]`` float32 logits for ``batch.logits_rows``.
        """
        ...

    def make_state_pool(self, num_slots: int) -> object | None:
        """Allocate the recurrent-state pool (``None`` for a pure-attention model)."""
        ...


class HiddenStatesLM(CausalLM, Protocol):
    """A ``CausalLM`` with the optional ``forward_with_hidden`` (see the module docstring)."""

    def forward_with_hidden(
        self, batch: ForwardBatch, kv: PagedKVCache | None, state: object | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class VerifyCommitLM(CausalLM, Protocol):
    """A recurrent ``CausalLM`` with the optional ``commit_verify`` (see the module docstring)."""

    def commit_verify(self, state: object, slots: list[int], num_kept: list[int]) -> None: ...
