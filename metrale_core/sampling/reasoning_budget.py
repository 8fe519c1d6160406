"""A request's reasoning budget: at most N tokens inside ``<think>`` ... ``</think>``, then the end
of the reasoning is forced and the answer follows.

Owner: the server builds a :class:`ReasoningBudget` for a request that asks for one (chat's
``thinking_token_budget``, Messages' ``thinking.budget_tokens``) and puts it on
``SamplingParams.reasoning_budget``; the core's built-in logit processor ``reasoning-budget``
(:class:`ReasoningBudgetProcessor`, registered by ``metrale_core.plugin.builtins``) enforces it.

State of one sequence, read from its output ids (llama.cpp's reasoning-budget sampler and vLLM's
thinking budget work the same way):

- *before*: the reasoning has not started; the output is free until it ends with ``start_ids``
  (a prompt that already opened ``<think>`` starts *inside*);
- *inside*: every output token counts; ``end_ids`` at the end of the output (the model closed the
  reasoning itself) -> *done*; ``budget`` tokens counted -> *forcing*;
- *forcing*: the next token of ``forced_ids`` is the only one allowed (every other logit
  ``-inf``); once all are out -> *done*;
- *done*: free for the rest of the answer.

Invariants:
- The processor writes only the rows of requests with a budget, and only while forcing; a row it
  forces keeps exactly one finite logit, the next forced token, so any sampler picks it.
- The state is a function of the output ids alone: cached per sequence for committed positions
  (whose ids only grow), computed afresh for a speculative verify position (whose history holds
  drafts that may be rejected).
- If the forced sequence starts with tokens the model already wrote (``forced_ids`` begins with
  ``\\n`` and the output ends with ``\\n``), forcing continues from there instead of repeating them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attrs import define, field, frozen, validators

from metrale_core.sampling.position import PositionKind

__all__ = ["ReasoningBudget", "ReasoningBudgetProcessor", "budget_state"]


def _ids(value: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(v) for v in value)


#: The key of the processor's per-sequence cache in ``row.extras``.
_EXTRA = "reasoning-budget"


@frozen
class ReasoningBudget:
    """One request's reasoning budget (token ids in the served tokenizer)."""

    #: Tokens allowed inside the reasoning section (0: end it at once).
    tokens: int = field(validator=validators.ge(0))
    #: What ends the section when the model writes it (``</think>``).
    end_ids: tuple[int, ...] = field(converter=_ids)
    #: What is forced when the budget is spent (``\n</think>\n\n``: it must contain ``end_ids``).
    forced_ids: tuple[int, ...] = field(converter=_ids)
    #: What opens the section (``<think>``); ignored when ``starts_inside``.
    start_ids: tuple[int, ...] = field(default=(), converter=_ids)
    #: The prompt already opened the section: the first output token is inside it.
    starts_inside: bool = False
    #: The request field it came from, for error messages.
    field: str = "thinking_token_budget"

    def __attrs_post_init__(self) -> None:
        if not self.end_ids or not self.forced_ids:
            raise ValueError("reasoning budget: end_ids and forced_ids must not be empty")
        if not self.starts_inside and not self.start_ids:
            raise ValueError("reasoning budget: start_ids are needed when the output starts outside the section")


@define
class _State:
    """Where one sequence is after its first ``seen`` output tokens."""

    seen: int = 0
    phase: str = "before"  # before | inside | forcing | done
    counted: int = 0
    #: While forcing: how many of ``forced_ids`` are out.
    forced: int = 0


def _ends_with(ids: Sequence[int], n: int, tail: tuple[int, ...]) -> bool:
    """``ids[:n]`` ends with ``tail``."""
    k = len(tail)
    return n >= k and tuple(ids[n - k : n]) == tail


def _advance(state: _State, budget: ReasoningBudget, ids: Sequence[int]) -> _State:
    """``state`` moved over ``ids[state.seen:]``."""
    for n in range(state.seen + 1, len(ids) + 1):
        token = ids[n - 1]
        if state.phase == "before":
            if _ends_with(ids, n, budget.start_ids):
                state.phase, state.counted = "inside", 0
                _spent(state, budget, ids, n)
        elif state.phase == "inside":
            state.counted += 1
            if _ends_with(ids, n, budget.end_ids):
                state.phase = "done"
            else:
                _spent(state, budget, ids, n)
        elif state.phase == "forcing":
            if token == budget.forced_ids[state.forced]:
                state.forced += 1
            if state.forced >= len(budget.forced_ids):
                state.phase = "done"
    state.seen = len(ids)
    return state


def _spent(state: _State, budget: ReasoningBudget, ids: Sequence[int], n: int) -> None:
    """Inside after ``ids[:n]``: start forcing once the budget is spent."""
    if state.counted >= budget.tokens:
        state.phase, state.forced = "forcing", _already_written(budget, ids[:n])


def _already_written(budget: ReasoningBudget, ids: Sequence[int]) -> int:
    """The longest prefix of ``forced_ids`` (short of all of it) the output already ends with."""
    forced = budget.forced_ids
    for k in range(min(len(forced) - 1, len(ids)), 0, -1):
        if tuple(ids[len(ids) - k :]) == forced[:k]:
            return k
    return 0


def budget_state(budget: ReasoningBudget, output_ids: Sequence[int], cached: _State | None = None) -> _State:
    """The state after ``output_ids`` (continuing ``cached`` when it saw a prefix of them)."""
    if cached is None or cached.seen > len(output_ids):
        cached = _State(phase="inside" if budget.starts_inside else "before")
        if budget.starts_inside:
            _spent(cached, budget, output_ids, 0)
    return _advance(cached, budget, output_ids)


class ReasoningBudgetProcessor:
    """The ``reasoning-budget`` logit processor (see the module docstring)."""

    handles_reasoning_budget = True

    def __init__(self, engine_config: Any = None) -> None:
        self.engine_config = engine_config

    def wants_row(self, row: Any) -> bool:
        return getattr(row.params, "reasoning_budget", None) is not None

    def __call__(self, logits: Any, ctx: Any) -> None:
        for j, (row, kind) in enumerate(zip(ctx.rows, ctx.kinds, strict=True)):
            budget = row.params.reasoning_budget
            if budget is None:
                continue
            # committed positions only grow, so their state is cached; a verify position's history
            # holds draft tokens that may be rejected, so it is computed afresh and not kept
            extras = row.extras if isinstance(row.extras, dict) and kind is not PositionKind.VERIFY else None
            state = budget_state(budget, row.output_ids, extras.get(_EXTRA) if extras is not None else None)
            if extras is not None:
                extras[_EXTRA] = state
            if state.phase == "forcing":
                token = budget.forced_ids[state.forced]
                keep = logits[j, token].clone()
                logits[j].fill_(float("-inf"))
                logits[j, token] = keep if bool(keep.isfinite()) else 0.0
