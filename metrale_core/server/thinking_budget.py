"""A chat request's reasoning budget (``thinking_token_budget``, vLLM's field; Messages'
``thinking.budget_tokens`` maps to it) as the engine's ``ReasoningBudget``.

Owner: ``server.translate.start_chat`` (every chat API: chat completions, Responses, Messages,
Ollama) passes it to ``generation.plan_jobs``; the core's ``reasoning-budget`` logit processor enforces it.

Invariants:
- No budget asked: None.  A budget on a model with no reasoning format (``--reasoning-parser``,
  else by model type) is a 400 naming the field: it could never be enforced.
- The harmony format (gpt-oss) has no forcible end of reasoning: a budget is a 400 there.
- A prompt whose template already closed the reasoning (thinking off: it ends with ``</think>``)
  has nothing to bound: None.  One that opened it (ends with ``<think>``) starts inside it.
- The forced end is ``\\n</think>\\n\\n``, what Qwen3-style templates put between the reasoning and
  the answer, so the answer after it reads as if the model had closed the section itself.
"""

from __future__ import annotations

from typing import Any

from metrale_core.sampling.reasoning_budget import ReasoningBudget
from metrale_core.server.errors import APIError

__all__ = ["chat_reasoning_budget"]

START, END, FORCED = "<think>", "</think>", "\n</think>\n\n"


def chat_reasoning_budget(
    host: Any, req: Any, prompt_text: str, *, field: str = "thinking_token_budget"
) -> ReasoningBudget | None:
    """The budget ``req`` asks for, in the served tokenizer's ids; ``field`` names it in a 400."""
    from metrale_core.server.chat_prompt import reasoning_format

    tokens = getattr(req, "thinking_token_budget", None)
    if tokens is None:
        return None
    fmt = reasoning_format(host)
    if fmt == "harmony":  # its reasoning ends with a channel switch, not a forcible </think>
        raise APIError(
            400, f"{field}: not supported for the harmony format (gpt-oss); use reasoning_effort", param=field
        )
    if fmt is None:
        raise APIError(
            400,
            f"{field}: the served model has no reasoning format, so there is no reasoning to bound "
            "(see --reasoning-parser)",
            param=field,
        )
    tail = prompt_text.rstrip()
    if tail.endswith(END):
        return None
    tok = host.ready().tokenizer

    def ids(text: str) -> tuple[int, ...]:
        return tuple(tok.encode(text, add_special_tokens=False))

    return ReasoningBudget(
        tokens=tokens,
        end_ids=ids(END),
        forced_ids=ids(FORCED),
        start_ids=ids(START),
        starts_inside=tail.endswith(START),
        field=field,
    )
