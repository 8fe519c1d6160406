"""``ForwardSpy``: wrap a real model and record what each logits row attended to.

Owner: parity tests (core and model plugins).  The spy delegates to the wrapped model and, for
every logits row the engine asks for, reconstructs the token history the model read — from the
slot mapping and block tables of each ``ForwardBatch`` — so a test can compare the row with an
oracle (HF transformers) run on exactly that history, and check the history is a real request's
prefix (which catches block-table and prefix-cache bugs the oracle alone would not).

Invariants: the spy never changes inputs or outputs; it only copies.  With attention windows
(KV groups) group 0's table may name a block that slid out of the window (``NULL_BLOCK``, < 0):
those positions are None in the history (the model no longer holds them), and a test matches
such a history on its known positions.
"""

from __future__ import annotations

import torch

__all__ = ["ForwardSpy"]


class ForwardSpy:
    """Delegates to ``model``; ``rows`` holds ``(history, logits_row)`` for every returned row."""

    def __init__(self, model):
        self._model = model
        self.info = model.info
        self.slot_tokens: dict[int, int] = {}
        self.rows: list[tuple[tuple[int | None, ...], torch.Tensor]] = []

    def make_state_pool(self, num_slots):
        return self._model.make_state_pool(num_slots)

    def lora_targets(self):
        """The wrapped model's LoRA targets, seen from the spy (so adapters can wrap a spied model)."""
        return self._model.lora_targets().under("_model")

    def forward(self, batch, kv, state=None):
        logits = self._model.forward(batch, kv, state)
        for slot, tok in zip(batch.slot_mapping.tolist(), batch.input_ids.tolist()):
            self.slot_tokens[slot] = tok
        bs = batch.block_size
        starts = batch.query_start.tolist()
        row_to_seq = {r: i for i in range(batch.num_seqs) for r in range(starts[i], starts[i + 1])}
        tables = batch.block_tables.tolist()
        positions = batch.positions.tolist()
        for j, r in enumerate(batch.logits_rows.tolist()):
            table = tables[row_to_seq[r]]
            history = tuple(
                None if table[q // bs] < 0 else self.slot_tokens[table[q // bs] * bs + q % bs]
                for q in range(positions[r] + 1)
            )
            self.rows.append((history, logits[j].detach().clone()))
        return logits
