"""Prefill-only pooling requests (embeddings): the engine seam.

Owner: ``LLMEngine.step`` calls :func:`plan_pools` before running a plan and :func:`pool_step`
after; the server's ``/v1/embeddings`` route puts a :class:`Pooling` record in a request's extras
(``extras={"pooling": Pooling("mean")}``) and reads :attr:`RequestOutput.embedding` from its one
final delta.

A pooling request is an ordinary sequence to the scheduler (same queue, same KV blocks, same
chunked prefill, batched with generating sequences in one forward); the only differences:

- Its prompt is never matched against the prefix cache (``Sequence.pools``), so every
  position runs and its final-normed hidden state is seen by the pool.
- A step that holds one runs the model's ``forward_with_hidden``; each of its chunks folds its
  rows into the pool (a running sum for ``mean``, the last row for ``last``).
- When its prompt is fully consumed it finishes with ``"stop"`` without sampling a token: its
  blocks are freed at once (no KV kept), and its final delta carries the L2-normalised vector.

Invariants:
- A chunk starting at position 0 resets the pool (a preempted sequence replays from 0).
- Pooling happens in float32, whatever the model dtype; the vector is on the CPU.
- ``mean`` divides by the prompt length; ``last`` is the hidden state of the prompt's last token.
- A model without ``forward_with_hidden`` cannot pool: :func:`can_pool` says so up front.
"""

from __future__ import annotations

from typing import Any

import torch
from attrs import define

from metrale_core.engine.deltas import RequestOutput

__all__ = ["POOLING_MODES", "Pooling", "can_pool", "default_pooling", "plan_pools", "pool_step"]

POOLING_MODES = ("mean", "last")


@define
class Pooling:
    """Per-sequence pooling state (``seq.extras["pooling"]``)."""

    mode: str
    total: torch.Tensor | None = None
    count: int = 0

    def __attrs_post_init__(self) -> None:
        if self.mode not in POOLING_MODES:
            raise ValueError(f"pooling must be one of {', '.join(POOLING_MODES)}, got {self.mode!r}")

    def fold(self, rows: torch.Tensor, start: int) -> None:
        """Add the hidden states ``rows`` ``[n, D]`` of positions ``start..start+n-1``."""
        rows = rows.detach().to(device="cpu", dtype=torch.float32)
        if start == 0:
            self.total, self.count = None, 0
        if self.mode == "last":
            self.total = rows[-1].clone()
        else:
            part = rows.sum(dim=0)
            self.total = part if self.total is None else self.total + part
        self.count += rows.shape[0]

    def vector(self) -> torch.Tensor:
        """The pooled, L2-normalised vector."""
        assert self.total is not None, "vector() of a pool that saw no rows"
        v = self.total if self.mode == "last" else self.total / self.count
        return torch.nn.functional.normalize(v, dim=0)


def can_pool(model: Any) -> bool:
    return callable(getattr(model, "forward_with_hidden", None))


def default_pooling(model: Any) -> str:
    """The model's declared pooling (a loader sets ``model.default_pooling``), else ``mean``."""
    mode = getattr(model, "default_pooling", None)
    return mode if mode in POOLING_MODES else "mean"


def plan_pools(plan: Any) -> bool:
    """True when a chunk of ``plan`` belongs to a pooling sequence (the step needs hidden states)."""
    return any(chunk.seq.pools for chunk in plan.chunks)


def pool_step(engine: Any, plan: Any, hidden: torch.Tensor | None) -> list:
    """Fold this step's hidden rows into each pooling sequence; finish the complete ones.

    Returns their final deltas.  Runs before the output processor, which then skips them
    (they are finished, so neither advanced nor sampled).  ``hidden`` is the step's
    ``ForwardResult.hidden``, which a step with pooling rows always asks for.
    """
    assert hidden is not None, "a pooling step keeps its hidden states"
    outputs = []
    row = 0
    for chunk in plan.chunks:
        n = chunk.num_tokens
        pool = chunk.seq.extras.get("pooling")
        if pool is not None and not chunk.seq.is_finished:
            pool.fold(hidden[row : row + n], chunk.start)
            seq = chunk.seq
            if chunk.start + n >= len(seq.prompt_ids):
                engine.scheduler.finish(seq, "stop")
                outputs.append(
                    RequestOutput(
                        request_id=seq.request_id,
                        finished=True,
                        finish_reason="stop",
                        num_prompt_tokens=len(seq.prompt_ids),
                        embedding=pool.vector(),
                    )
                )
        row += n
    return outputs
