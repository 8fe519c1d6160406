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
  model must reset the recurrent state in ``state_slots[i]`` before consuming.
- Nothing here imports a model plugin; plugins import this module.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from attrs import define, field, frozen

__all__ = [
    "CausalLM",
    "ForwardBatch",
    "KVLayout",
    "ModelInfo",
    "PagedKVCache",
    "RecurrentLayout",
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

    def bytes_per_token(self) -> int:
        """Bytes of K plus V across all layers for one token."""
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * itemsize


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


@define
class PagedKVCache:
    """The paged K/V pool: one K and one V tensor per attention layer.

    ``k[layer]`` and ``v[layer]`` have shape ``[num_blocks, block_size, num_kv_heads, head_dim]``.
    A token at slot ``s`` lives at ``[s // block_size, s % block_size]``.
    """

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    block_size: int
    #: Free-form per-layer extras owned by KV-dtype plugins (e.g. FP8 scales).
    extras: dict = field(factory=dict)

    @classmethod
    def allocate(cls, layout: KVLayout, num_blocks: int, block_size: int,
                 device: torch.device | str = "cpu") -> "PagedKVCache":
        shape = (num_blocks, block_size, layout.num_kv_heads, layout.head_dim)
        return cls(
            k=[torch.zeros(shape, dtype=layout.dtype, device=device) for _ in range(layout.num_layers)],
            v=[torch.zeros(shape, dtype=layout.dtype, device=device) for _ in range(layout.num_layers)],
            block_size=block_size,
        )

    @property
    def num_blocks(self) -> int:
        return self.k[0].shape[0] if self.k else 0


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

    def forward(self, batch: ForwardBatch, kv: PagedKVCache | None,
                state: object | None = None) -> torch.Tensor:
        """Consume ``batch``, writing K/V (and advancing recurrent state in ``state``).

        Returns ``[N, vocab]`` float32 logits for ``batch.logits_rows``.
        """
        ...

    def make_state_pool(self, num_slots: int) -> object | None:
        """Allocate the recurrent-state pool (``None`` for a pure-attention model)."""
        ...
