"""``ModelRunner``: the device side of a step.

Owner: ``LLMEngine`` builds one per engine; :meth:`ModelRunner.execute` turns a
``SchedulerOutput`` into a ``ForwardBatch`` and calls the model's forward.  The runner makes no
scheduling decisions; it owns the paged KV cache and the recurrent-state pool.

Invariants:
- Rows are laid out exactly in the plan's chunk order (decode rows first, then prefill chunks).
- The batch carries the plan's ``split`` as it is (``ForwardBatch.split``); the runner never
  classifies rows itself.
- Logits are requested only for rows that will be sampled: the last row of a chunk that reaches
  the end of its sequence (the prompt's last token, or a decode row), and every row of a
  speculative verify chunk ``[last, d1..dk]``.  Replayed positions of a
  preempted sequence never produce logits.
- ``state_fresh[i]`` is True exactly when chunk ``i`` starts at position 0.
- With attention windows each KV group after the first gets its own block tables and slots
  (``ForwardBatch.group_block_tables`` / ``group_slot_mappings``); a row is only ever written
  through blocks its chunk holds (never ``NULL_BLOCK``).
- What a forward computed comes back in its :class:`ForwardResult` (logits, and hidden states
  when asked); the runner keeps nothing of a step for others to read afterwards.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import cast

import torch
from attrs import frozen
from loguru import logger

from metrale_core.engine.plan import SchedulerOutput
from metrale_core.model_api import CausalLM, ForwardBatch, HiddenStatesLM, PagedKVCache, VerifyCommitLM

__all__ = ["ForwardResult", "ModelRunner", "model_device"]


@frozen
class ForwardResult:
    """What one :meth:`ModelRunner.execute` computed."""

    #: ``[N, vocab]`` float32 logits of the sampled rows, in plan order (None: an empty plan).
    logits: torch.Tensor | None
    #: ``[T, D]`` final-normed hidden states of every row, when the step asked for them (a
    #: pooling step, or every step after :meth:`ModelRunner.keep_hidden_states`); else None.
    hidden: torch.Tensor | None = None


def model_device(model: CausalLM) -> torch.device:
    """The device a model runs on: its ``device`` attribute, its first parameter's, else CPU."""
    device = getattr(model, "device", None)
    if device is not None:
        return torch.device(device)
    parameters = getattr(model, "parameters", None)
    if callable(parameters):
        for p in parameters():
            return p.device
    return torch.device("cpu")


class ModelRunner:
    """Owns the KV cache and state pool of one model and runs its forward."""

    def __init__(
        self, model: CausalLM, num_blocks: int, block_size: int, num_state_slots: int, kv_storage=None
    ) -> None:
        """``kv_storage`` (a ``kv_dtype.KVStorage``) sets the pool's dtype and codec; None keeps
        the model's layout with plain storage."""
        self.model = model
        self.block_size = block_size
        self.device = model_device(model)
        info = model.info
        self.kv: PagedKVCache | None = None
        if info.kv is not None and info.kv.num_layers > 0:
            layout = info.kv if kv_storage is None else kv_storage.layout
            codec = None if kv_storage is None else kv_storage.codec
            self.kv = PagedKVCache.allocate(layout, num_blocks, block_size, device=self.device, codec=codec)
        self.state = model.make_state_pool(num_state_slots) if info.has_recurrent_state else None
        #: Whether :meth:`execute` runs ``forward_with_hidden`` (see :meth:`keep_hidden_states`).
        self.keeps_hidden = False
        #: The LoRA ``AdapterBank`` (``engine.adapters``; set by metrale-lora); None: no adapters.
        self.lora = None
        logger.debug(
            "model runner: {} KV blocks of {} tokens on {}, {} state slots",
            num_blocks,
            block_size,
            self.device,
            num_state_slots if self.state is not None else 0,
        )

    def build_batch(self, plan: SchedulerOutput) -> ForwardBatch:
        """The ``ForwardBatch`` of ``plan`` (see ``metrale_core.model_api``)."""
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start = [0]
        context_lens: list[int] = []
        logits_rows: list[int] = []
        for chunk in plan.chunks:
            n = chunk.num_tokens
            input_ids.extend(chunk.token_ids)
            for pos in range(chunk.start, chunk.start + n):
                slots.append(chunk.block_ids[pos // bs] * bs + pos % bs)
            positions.extend(range(chunk.start, chunk.start + n))
            query_start.append(query_start[-1] + n)
            context_lens.append(chunk.start + n)
            if chunk.sample:  # the last row, or every row of a verify chunk
                logits_rows.extend(range(query_start[-1] - chunk.num_logits, query_start[-1]))
        width = max(len(c.block_ids) for c in plan.chunks)
        tables = [list(c.block_ids) + [0] * (width - len(c.block_ids)) for c in plan.chunks]

        def t(values, dtype=torch.int64):
            return torch.tensor(values, dtype=dtype, device=self.device)

        group_tables, group_slots = self._group_tables(plan, width)

        return ForwardBatch(
            input_ids=t(input_ids),
            positions=t(positions),
            query_start=t(query_start),
            context_lens=t(context_lens),
            block_tables=t(tables).reshape(len(tables), width),
            slot_mapping=t(slots),
            logits_rows=t(logits_rows),
            state_slots=t([c.state_slot for c in plan.chunks]),
            state_fresh=t([c.start == 0 for c in plan.chunks], torch.bool),
            query_lens_host=tuple(c.num_tokens for c in plan.chunks),
            context_lens_host=tuple(context_lens),
            block_size=bs,
            verify_host=tuple(c.is_verify for c in plan.chunks),
            group_block_tables=tuple(t(g).reshape(len(g), width) for g in group_tables),
            group_slot_mappings=tuple(t(g) for g in group_slots),
            split=plan.split,
        )

    def _group_tables(self, plan: SchedulerOutput, width: int) -> tuple[list, list]:
        """Block tables ``[B][width]`` and slots ``[T]`` of each KV group after the first
        (``NULL_BLOCK`` and padding read as block 0, which no row attends to)."""
        chunks = plan.chunks
        num = len(chunks[0].group_block_ids) if chunks else 0
        bs = self.block_size
        tables: list = []
        slots: list = []
        for g in range(num):
            tables.append(
                [[max(b, 0) for b in c.group_block_ids[g]] + [0] * (width - len(c.block_ids)) for c in chunks]
            )
            slots.append(
                [
                    c.group_block_ids[g][pos // bs] * bs + pos % bs
                    for c in chunks
                    for pos in range(c.start, c.start + c.num_tokens)
                ]
            )
        return tables, slots

    def keep_hidden_states(self) -> None:
        """From now on every :meth:`execute` runs the model's ``forward_with_hidden`` and returns
        the final-normed hidden states of every row in its result (an MTP proposer reads them;
        set once by the engine's speculation driver)."""
        self.keeps_hidden = True

    def execute(self, plan: SchedulerOutput, *, hidden: bool = False) -> ForwardResult:
        """Run the model over ``plan``; the result holds the sampled rows' logits (None for an
        empty plan) and, when ``hidden`` (this step pools embeddings) or after
        :meth:`keep_hidden_states`, every row's hidden states."""
        if plan.is_empty:
            return ForwardResult(None)
        batch = self.build_batch(plan)
        states = None
        with nullcontext() if self.lora is None else self.lora.scope(plan):
            if self.keeps_hidden or hidden:
                # only a model with forward_with_hidden keeps hidden states (checked where they are asked for)
                logits, states = cast(HiddenStatesLM, self.model).forward_with_hidden(batch, self.kv, self.state)
            else:
                logits = self.model.forward(batch, self.kv, self.state)
        expected = int(batch.logits_rows.shape[0])
        if logits.shape[0] != expected:
            raise RuntimeError(f"model returned {logits.shape[0]} logits rows, expected {expected}")
        return ForwardResult(logits.float(), states)

    def commit_verify(self, slots: list[int], num_kept: list[int]) -> None:
        """After a step with verify chunks of a recurrent model: each sequence's state must end
        as if only the first ``num_kept[i]`` rows of its verify chunk had been consumed."""
        if self.state is not None and slots:
            # a recurrent model is speculated on only with commit_verify (ConfigError otherwise)
            cast(VerifyCommitLM, self.model).commit_verify(self.state, slots, num_kept)
