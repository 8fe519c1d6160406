"""Run greedy requests through an engine, the later ones joining while the first still prefills.

Owner: the engine-path parity tests (core and model plugins), which all drive the engine the same
way: the first request alone for a few steps (so its prompt is mid-prefill), then the others, then
steps until every request is done.

Invariants: the engine is only driven through ``add_request`` / ``step`` / ``has_unfinished``;
request ids are ``r0``, ``r1``, ... in prompt order, and the result lists each request's new
tokens in that order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["run_joining_mid_prefill"]


def run_joining_mid_prefill(
    engine: Any, prompts: Sequence[Sequence[int]], params: Any, lead_steps: int = 1
) -> list[list[int]]:
    """Add ``prompts[0]``, step ``lead_steps`` times, add the rest, step to the end; return the
    new token ids of each prompt's request."""
    outputs: dict[str, list[int]] = {}

    def drain() -> None:
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.new_token_ids)

    engine.add_request("r0", list(prompts[0]), params)
    for _ in range(lead_steps):
        drain()
    for i, prompt in enumerate(prompts[1:], start=1):
        engine.add_request(f"r{i}", list(prompt), params)
    while engine.has_unfinished():
        drain()
    return [outputs[f"r{i}"] for i in range(len(prompts))]
