"""Run greedy requests through an engine, the later ones joining while the first still prefills;
and step an engine to the end, collecting each request's outputs.

Owner: the engine-path parity tests (core and model plugins), which all drive the engine the same
way: the first request alone for a few steps (so its prompt is mid-prefill), then the others, then
steps until every request is done; :func:`run_all` for the engine tests that only step to the end.

Invariants: the engine is only driven through ``add_request`` / ``step`` / ``has_unfinished``;
request ids are ``r0``, ``r1``, ... in prompt order, and the result lists each request's new
tokens in that order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["run_all", "run_joining_mid_prefill"]


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


def run_all(engine: Any, max_steps: int = 10_000) -> dict[str, list[Any]]:
    """Step until no request is unfinished; return request id -> its outputs in step order.
    Raises ``AssertionError`` if ``max_steps`` steps do not finish them."""
    outs: dict[str, list[Any]] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return outs
        for o in engine.step():
            outs.setdefault(o.request_id, []).append(o)
    raise AssertionError("engine did not finish")
