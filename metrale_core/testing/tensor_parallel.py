"""Drive one engine over a fixed schedule and keep what it computed: the tensor-parallel oracle.

Owner: the tensor-parallel tests (core and model plugins) and ``bench/bench_parallel.py``, which
compare a model loaded over N ranks with the same model on one, through the real engine path.

Invariants: the engine is driven only through ``add_request`` / ``step``; the logits of every
step (rank 0's ``ModelRunner.execute`` result) are kept in order, so two runs with the same
configuration can be compared step by step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attrs import define, field

__all__ = ["EngineRun", "run_recording"]


@define
class EngineRun:
    """What one engine run produced."""

    #: request id -> generated token ids.
    tokens: dict[str, list[int]] = field(factory=dict)
    #: The logits of each step with sampled rows, in step order (``[N, vocab]`` float32).
    logits: list[Any] = field(factory=list)
    #: Sequences preempted over the run.
    preemptions: int = 0
    #: Steps with more than one decode row (batched decode happened).
    batched_decode_steps: int = 0
    #: Steps that fed part of a prompt (chunked prefill happened).
    partial_prefill_steps: int = 0


def run_recording(
    engine: Any, prompts: Sequence[Sequence[int]], params: Any, *, lead_steps: int = 1, max_steps: int = 10_000
) -> EngineRun:
    """Add ``prompts[0]``, step ``lead_steps`` times, add the rest (ids ``r0``...), step to the end."""
    run = EngineRun()
    execute = engine.runner.execute

    def recording(plan: Any, **kwargs: Any) -> Any:
        result = execute(plan, **kwargs)
        if result.logits is not None:
            run.logits.append(result.logits.clone())
        run.batched_decode_steps += len(plan.decode_chunks) > 1
        run.partial_prefill_steps += any(not c.is_decode and not c.sample for c in plan.chunks)
        return result

    engine.runner.execute = recording

    def drain() -> None:
        for out in engine.step():
            run.tokens.setdefault(out.request_id, []).extend(out.new_token_ids)

    try:
        engine.add_request("r0", list(prompts[0]), params)
        for _ in range(lead_steps):
            drain()
        for i, prompt in enumerate(prompts[1:], start=1):
            engine.add_request(f"r{i}", list(prompt), params)
        for _ in range(max_steps):
            if not engine.has_unfinished():
                break
            drain()
        else:
            raise AssertionError(f"the engine did not finish in {max_steps} steps")
    finally:
        engine.runner.execute = execute
    run.preemptions = engine.stats().num_preemptions
    return run
