"""``SamplingParams``: the per-request knobs of the logit pipeline and sampler.

Owner: the frontend builds one per request; the output processor and the sampler read it.
Invariants: validated at construction (a bad value raises ``ValueError`` naming the field), so
the engine never sees an invalid request.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from attrs import field, frozen, validators

from metrale_core.sampling.reasoning_budget import ReasoningBudget
from metrale_core.sampling.structured import StructuredOutput

__all__ = ["SamplingParams"]


def _finite(instance, attribute, value):
    if value is not None and not math.isfinite(value):
        raise ValueError(f"{attribute.name} must be finite, got {value!r}")


def as_tuple(value: Iterable[Any]) -> tuple[Any, ...]:
    """``tuple(value)`` as an attrs converter (typed, so checkers see the field's input type)."""
    return tuple(value)


def _bias(value) -> tuple[tuple[int, float], ...]:
    if not value:
        return ()
    items = value.items() if isinstance(value, dict) else value
    return tuple(sorted((int(k), float(v)) for k, v in items))


@frozen
class SamplingParams:
    """Sampling parameters of one request (OpenAI semantics where they exist)."""

    #: 0 means greedy (argmax, first max wins).
    temperature: float = field(default=1.0, validator=[_finite, validators.ge(0.0)])
    #: Keep the smallest set of most-likely tokens whose mass reaches ``top_p`` (1.0 = off).
    top_p: float = field(default=1.0, validator=[validators.gt(0.0), validators.le(1.0)])
    #: Keep the ``top_k`` most-likely tokens (0 = off).
    top_k: int = field(default=0, validator=validators.ge(0))
    #: Drop tokens whose probability is below ``min_p`` times the top probability (0 = off).
    min_p: float = field(default=0.0, validator=[validators.ge(0.0), validators.le(1.0)])
    presence_penalty: float = field(default=0.0, validator=_finite)
    frequency_penalty: float = field(default=0.0, validator=_finite)
    #: >1 discourages tokens already in prompt or output (HF / vLLM semantics).
    repetition_penalty: float = field(default=1.0, validator=[_finite, validators.gt(0.0)])
    #: ``((token_id, bias), ...)`` added to the logits; a dict is accepted.
    logit_bias: tuple[tuple[int, float], ...] = field(default=(), converter=_bias)
    #: Per-request seed: the same seed gives the same tokens whatever else is in the batch.
    seed: int | None = None
    #: Maximum number of tokens to generate (>= 1).
    max_tokens: int = field(default=16, validator=validators.ge(1))
    #: Stop strings (not included in the output text).
    stop: tuple[str, ...] = field(default=(), converter=as_tuple)
    #: Stop token ids (the token is not included in the output text).
    stop_token_ids: tuple[int, ...] = field(default=(), converter=as_tuple)
    #: Keep generating past EOS.
    ignore_eos: bool = False
    #: Number of top logprobs to return per token (None = no logprobs).
    logprobs: int | None = field(default=None, validator=validators.optional(validators.ge(0)))
    #: Output constraint (JSON Schema, regex, grammar, forced tool calls), enforced by the logit
    #: processor that handles structured output; None = unconstrained.
    structured: StructuredOutput | None = field(
        default=None, validator=validators.optional(validators.instance_of(StructuredOutput))
    )
    #: At most this many tokens of reasoning, then its end is forced (the built-in
    #: ``reasoning-budget`` processor); None = unbounded.
    reasoning_budget: ReasoningBudget | None = field(
        default=None, validator=validators.optional(validators.instance_of(ReasoningBudget))
    )

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0
