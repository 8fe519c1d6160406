"""The model contract: what a model plugin implements and what the engine hands it.

Owner: the model runner (``metrale_core.engine.runner``) builds a :class:`ForwardBatch` from the
scheduler's plan and calls :meth:`CausalLM.forward`; model plugins implement :class:`CausalLM`.
The KV side of the contract (layouts, codecs, the paged cache) is :mod:`metrale_core.model_api.kv`;
this package exports it with the rest of the contract.

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
- ``split`` (a :class:`StepSplit`) is the step's one-row / multi-row split as the scheduler
  planned it; a model reads it and never classifies ``query_lens_host`` again.

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
- ``lora_targets() -> LoRATargets`` (``metrale_core.layers.lowrank.lora_targets``, protocol
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
from attrs import Factory, evolve, field, frozen

from metrale_core.model_api.kv import (
    KVCodec,
    KVGroup,
    KVGroups,
    KVLayout,
    PagedKVCache,
    PlainKVCodec,
    RecurrentLayout,
    gather_blocks,
    zeroed_pages,
)
from metrale_core.model_api.split import StepSplit

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
    "StepSplit",
    "VerifyCommitLM",
    "gather_blocks",
    "zeroed_pages",
]


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
    #: Which sequences feed one row and which several (see :class:`StepSplit`): the engine
    #: carries the scheduler's record here; a batch built without one (a plugin's test) derives
    #: it from ``query_lens_host`` when it is made, and only then.
    split: StepSplit = field(default=Factory(lambda self: StepSplit.of_lengths(self.query_lens_host), takes_self=True))

    @split.validator
    def _split_matches(self, _attribute, split: StepSplit) -> None:
        if split.num_seqs != len(self.query_lens_host):
            raise ValueError(f"the split covers {split.num_seqs} sequences, the batch {len(self.query_lens_host)}")

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
        """Every sequence feeds exactly one row (the batched decode fast path; ``split``'s)."""
        return self.split.is_pure_decode


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
