"""Tensor-parallel building blocks: the rank's group, how each tensor is split, and the layers
that put the pieces back together.

Owner: ``metrale_core.layers``; a model plugin that supports ``--tensor-parallel-size`` builds its
decoder from these (the model contract, ``metrale_core.model_api``, says how); the executors
(``metrale_core.parallel``) create the :class:`TensorParallel` group a loader receives in
``LoadOptions.tensor_parallel``.

Megatron's split, as vLLM and nano-vllm do it:

- column-parallel (``q/k/v``, ``gate/up``, the output head): each rank keeps a range of output
  rows, no communication;
- row-parallel (``o_proj``, ``down_proj``): each rank keeps the matching range of input columns
  and the partial products are summed by one all-reduce (:class:`RowParallelLinear`; the bias is
  added once, after the sum) -- two all-reduces per decoder layer;
- vocab-parallel embedding (:class:`VocabParallelEmbedding`): each rank looks up the ids in its
  range of rows, zeros elsewhere, one all-reduce; the output head keeps the same range of rows
  and its logits are gathered on rank 0 (:class:`ParallelHead`);
- attention heads by KV group (:func:`split_heads`): each rank keeps whole GQA groups (uneven
  splits are fine: SmolLM2's 3 KV heads go 2 + 1 over two ranks); with more ranks than KV heads,
  the query heads are split and each rank keeps a copy of the one KV head its queries read.

A loader never slices tensors itself: it wraps its store in a :class:`ShardedStore` with one
:class:`Shard` per split tensor, so ``build_linear`` / ``build_embedding`` read only the rank's
rows or columns, in every weight format: dense tensors are sliced, and a tensor kept in its
quantized blocks (``get_raw``) is split between blocks -- a split that would cut a block is a
``ShapeMismatch`` naming the tensor, raised at load.  A part of quantized blocks is a view of the
stored rows (no page is read until it is repacked) whose ``source`` names the part, so the repack
cache keeps each rank's records.

Invariants:
- With ``world == 1`` every layer here is the identity wrapper and no collective runs.
- Collectives go through ``torch.distributed`` on the group's ``ProcessGroup`` (gloo on CPU, NCCL
  on CUDA): the same code for both.
- Rank 0's logits are the full ``[N, vocab]``; the other ranks' head output is only their part.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from attrs import field, frozen

from metrale_core.errors import ConfigError, ShapeMismatch

__all__ = [
    "HeadSplit",
    "ParallelHead",
    "RowParallelLinear",
    "Shard",
    "ShardedStore",
    "TensorParallel",
    "VocabParallelEmbedding",
    "split_heads",
    "split_range",
    "split_unit",
]

#: GGML types -> elements per block along a row (a row-parallel split must fall between blocks).
_BLOCK_ELEMENTS = {"Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q8_0": 32, "Q8_1": 32, "IQ4_NL": 32}
_SUPER_BLOCK = 256  # every K-quant and the other IQ types


@frozen
class TensorParallel:
    """This process's place in the tensor-parallel group and the collectives over it."""

    rank: int = 0
    world: int = 1
    #: The ``torch.distributed`` ``ProcessGroup`` of the forward's collectives (None: world 1).
    group: Any = field(default=None, repr=False, eq=False)

    @property
    def enabled(self) -> bool:
        return self.world > 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of ``x`` over the ranks (in place; returned)."""
        if self.world > 1:
            torch.distributed.all_reduce(x, group=self.group)
        return x

    def gather_last_dim(self, x: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
        """Rank 0: ``[..., sum(sizes)]``, every rank's ``x`` (``[..., sizes[rank]]``) side by side;
        the other ranks get ``x`` back.  Parts are padded to the largest size for the gather."""
        if self.world == 1:
            return x
        width = max(sizes)
        padded = x if x.shape[-1] == width else F.pad(x, (0, width - x.shape[-1]))
        padded = padded.contiguous()
        parts = [torch.empty_like(padded) for _ in range(self.world)] if self.rank == 0 else None
        torch.distributed.gather(padded, parts, dst=0, group=self.group)
        if self.rank != 0:
            return x
        assert parts is not None
        return torch.cat([p[..., :n] for p, n in zip(parts, sizes, strict=True)], dim=-1)


def split_range(n: int, world: int, rank: int, unit: int = 1) -> tuple[int, int]:
    """``(start, size)`` of rank ``rank``'s part of ``n`` items split in whole ``unit``\\ s as evenly
    as possible (the first ranks get one unit more); ``n`` must be whole units."""
    if n % unit:
        raise ConfigError(f"{n} is not a multiple of {unit}; it cannot be split in units of {unit}")
    units = n // unit
    if units < world:
        raise ConfigError(f"{n} items ({units} units of {unit}) cannot be split over {world} ranks")
    base, extra = divmod(units, world)
    start = rank * base + min(rank, extra)
    return start * unit, (base + (rank < extra)) * unit


def split_unit(n: int, world: int = 1, preferred: Sequence[int] = (_SUPER_BLOCK, 32)) -> int:
    """The largest of ``preferred`` that divides ``n`` into at least ``world`` units (1 if none): a
    split in these units falls between quantization blocks whatever the weight format."""
    return next((u for u in preferred if n % u == 0 and n // u >= world), 1)


@frozen
class HeadSplit:
    """The attention heads one rank keeps (see :func:`split_heads`)."""

    q_start: int
    num_heads: int
    kv_start: int
    num_kv_heads: int


def split_heads(num_heads: int, num_kv_heads: int, world: int, rank: int) -> HeadSplit:
    """Rank ``rank``'s query and KV heads: whole GQA groups when ``world <= num_kv_heads``, else
    an equal share of the query heads with a copy of their KV head."""
    if num_heads % num_kv_heads:
        raise ConfigError(f"{num_heads} heads are not a whole number of groups of {num_kv_heads} KV heads")
    group = num_heads // num_kv_heads
    if world <= num_kv_heads:
        kv_start, kv = split_range(num_kv_heads, world, rank)
        return HeadSplit(kv_start * group, kv * group, kv_start, kv)
    if num_heads % world or world % num_kv_heads:
        raise ConfigError(
            f"tensor parallel size {world} cannot split {num_heads} query heads over "
            f"{num_kv_heads} KV heads: with more ranks than KV heads it must divide the "
            f"query heads and be a multiple of the KV heads"
        )
    per = num_heads // world
    q_start = rank * per
    return HeadSplit(q_start, per, q_start // group, 1)


@frozen
class Shard:
    """Keep ``size`` entries of dimension ``dim`` from ``start`` (0: rows, 1: columns)."""

    dim: int
    start: int
    size: int


def _block_elements(quant_type: str) -> int:
    if quant_type in ("F32", "F16", "BF16", "F64"):
        return 1
    return _BLOCK_ELEMENTS.get(quant_type, _SUPER_BLOCK)


class ShardedStore:
    """A weight store that shows each tensor of ``shards`` as only this rank's part.

    ``get`` / ``shape`` / ``get_raw`` return the part; every other attribute is the wrapped
    store's.  A column split of a tensor stored in quantized blocks must fall between blocks
    (``ShapeMismatch`` naming the tensor otherwise).
    """

    def __init__(self, store: Any, shards: dict[str, Shard], weight_format: str = "auto") -> None:
        self._store = store
        self.shards = dict(shards)
        #: ``int8`` / ``int4`` re-quantize per block of 32 columns: a column split must keep them.
        self.weight_format = weight_format

    def __contains__(self, name: object) -> bool:
        return name in self._store

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._store, attr)

    def shape(self, name: str) -> tuple[int, ...]:
        shape = tuple(self._store.shape(name))
        shard = self.shards.get(name)
        if shard is None:
            return shape
        return (*shape[: shard.dim], shard.size, *shape[shard.dim + 1 :])

    def get(self, name: str, *, dtype: torch.dtype = torch.float32, shape: Sequence[int] | None = None) -> torch.Tensor:
        shard = self.shards.get(name)
        if shard is None:
            return self._store.get(name, dtype=dtype, shape=shape)
        self._check(name, shape)
        if shard.dim == 1 and self.weight_format in ("int8", "int4") and (shard.start % 32 or shard.size % 32):
            raise ShapeMismatch(
                f"tensor {name!r} cannot be split for tensor parallelism in weight format "
                f"{self.weight_format}: columns {shard.start}..{shard.start + shard.size} cut its blocks "
                f"of 32; use another tensor parallel size or --weight-format exact"
            )
        full = self._store.get(name, dtype=dtype)
        return full.narrow(shard.dim, shard.start, shard.size).contiguous()

    def get_raw(self, name: str) -> Any:
        raw = self._store.get_raw(name)
        shard = self.shards.get(name)
        if shard is None:
            return raw
        shape = tuple(int(s) for s in raw.shape)
        new_shape = (*shape[: shard.dim], shard.size, *shape[shard.dim + 1 :])
        source = getattr(raw, "source", None)
        if source is not None:  # the part's own name: the repack cache keeps each rank's records apart
            source = source._replace(name=f"{source.name}@{shard.dim}:{shard.start}+{shard.size}", shape=new_shape)
        if isinstance(raw.data, torch.Tensor):  # safetensors: the stored dtype, HF layout
            data: Any = raw.data.narrow(shard.dim, shard.start, shard.size).contiguous()
            return type(raw)(data, raw.quant_type, new_shape, source)
        rows = np.asarray(raw.data).reshape(shape[0], -1)
        if shard.dim == 0:
            return type(raw)(rows[shard.start : shard.start + shard.size], raw.quant_type, new_shape, source)
        per_block = _block_elements(raw.quant_type)
        if shard.start % per_block or shard.size % per_block:
            raise ShapeMismatch(
                f"tensor {name!r} ({raw.quant_type}, shape {list(shape)}) cannot be split for tensor "
                f"parallelism: columns {shard.start}..{shard.start + shard.size} cut its blocks of "
                f"{per_block}; use a tensor parallel size that splits it between blocks"
            )
        bytes_per_elem = rows.shape[1] / shape[1]
        lo, hi = int(shard.start * bytes_per_elem), int((shard.start + shard.size) * bytes_per_elem)
        # a view (strided rows): a lazily repacked expert's pages are read on its first call
        return type(raw)(rows[:, lo:hi], raw.quant_type, new_shape, source)

    def _check(self, name: str, shape: Sequence[int] | None) -> None:
        if shape is not None and tuple(int(s) for s in shape) != self.shape(name):
            raise ShapeMismatch(
                f"tensor {name!r} has shape {list(self.shape(name))} on this rank but the "
                f"model expects {[int(s) for s in shape]}; the checkpoint does not match "
                f"its config"
            )


@frozen
class RowParallelLinear:
    """A row-parallel projection: this rank's columns of the matrix (``inner``, any weight
    format) times its slice of the input, summed over the ranks, then the bias once."""

    inner: Any
    tp: TensorParallel
    bias: torch.Tensor | None = None

    @property
    def out_features(self) -> int:
        return int(self.inner.out_features)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.tp.all_reduce(self.inner(x))
        return y if self.bias is None else y + self.bias


@frozen
class VocabParallelEmbedding:
    """Rows ``start .. start + size`` of the token table (a tensor or a quantized table); other
    ids read zeros here and their rows come from the rank that has them (one all-reduce)."""

    table: Any
    start: int
    size: int
    tp: TensorParallel
    lookup: Any = field(repr=False)  # (ids, table) -> rows, e.g. ``linear.embed_tokens``

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        if not self.tp.enabled:
            return self.lookup(ids, self.table)
        local = ids - self.start
        inside = (local >= 0) & (local < self.size)
        rows = self.lookup(torch.where(inside, local, torch.zeros_like(local)), self.table)
        rows = rows * inside.unsqueeze(-1).to(rows.dtype)
        return self.tp.all_reduce(rows.contiguous())


@frozen
class ParallelHead:
    """The output head over this rank's vocabulary rows; rank 0 gets every rank's logits."""

    inner: Any
    tp: TensorParallel
    #: Vocabulary rows each rank keeps, in rank order.
    sizes: tuple[int, ...]

    @property
    def out_features(self) -> int:
        return sum(self.sizes)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.gather_last_dim(self.inner(x), self.sizes)
