"""The DRY penalty: settings, the match-length search, and the logit processor.

Owner: ``LogitProcessorSpec("dry").factory(engine_config)`` (:func:`build`) makes one
:class:`DryPenalty` per engine; the logit pipeline calls it once per step on the rows of kind
``PREFILL_LAST`` / ``FINAL_DECODE``.

Invariants:
- A row's context is ``prompt_ids + output_ids`` (the tokens before the position sampled), cut
  to the last ``penalty_last_n`` when that is set.
- For a candidate token ``t``: ``n`` = the longest suffix of the context which, followed by
  ``t``, occurs earlier in the context (capped at :data:`MAX_MATCH`; a breaker token ends every
  match); ``t`` loses ``multiplier * base ** (n - allowed_length)`` when ``n >= allowed_length``.
  Only such tokens change; every other logit is left bit-for-bit as it was.
- Stateless between steps: the same context gives the same penalties.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from attrs import field, frozen

from metrale_core.api import ConfigError, ProcessorContext

__all__ = ["MAX_MATCH", "DryPenalty", "DrySettings", "build", "match_lengths"]

#: Longest repeat measured (the penalty is astronomically large well before this).
MAX_MATCH = 50


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


@frozen
class DrySettings:
    """The DRY knobs (the ``--dry-*`` flags)."""

    multiplier: float
    base: float = 1.75
    allowed_length: int = 2
    penalty_last_n: int = 0
    breaker_ids: frozenset[int] = field(default=frozenset(), converter=frozenset)

    def __attrs_post_init__(self) -> None:
        _check(self.multiplier >= 0, f"--dry-multiplier must be >= 0, got {self.multiplier}")
        _check(self.base >= 1, f"--dry-base must be >= 1, got {self.base}")
        _check(self.allowed_length >= 1, f"--dry-allowed-length must be >= 1, got {self.allowed_length}")
        _check(self.penalty_last_n >= 0, f"--dry-penalty-last-n must be >= 0, got {self.penalty_last_n}")

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> DrySettings:
        """From ``EngineConfig.plugin_options`` (missing keys take the flag defaults)."""
        from metrale_dry import DEFAULTS

        value = {key: options.get(key, default) for key, default in DEFAULTS.items()}
        return cls(
            multiplier=float(value["dry_multiplier"]),
            base=float(value["dry_base"]),
            allowed_length=int(value["dry_allowed_length"]),
            penalty_last_n=int(value["dry_penalty_last_n"]),
            breaker_ids=value["dry_breaker_ids"],
        )

    def penalty(self, length: int) -> float:
        return self.multiplier * self.base ** (length - self.allowed_length)


def match_lengths(context: Sequence[int], breaker_ids: frozenset[int] = frozenset()) -> dict[int, int]:
    """Token -> length of the longest repeat it would extend (see the module docstring)."""
    ids = np.asarray(context, dtype=np.int64)
    n = len(ids)
    if n < 2 or int(ids[-1]) in breaker_ids:
        return {}
    breakers = np.fromiter(breaker_ids, dtype=np.int64, count=len(breaker_ids))
    # earlier occurrences of the last token whose successor is not a breaker
    ends = np.flatnonzero(ids[:-1] == ids[-1])
    ends = ends[~np.isin(ids[ends + 1], breakers)]
    lengths = np.ones(len(ends), dtype=np.int64)
    alive = np.ones(len(ends), dtype=bool)
    for k in range(1, MAX_MATCH):
        if n - 1 - k < 0 or not alive.any():
            break
        current = ids[n - 1 - k]
        if int(current) in breaker_ids:
            break
        earlier = ends - k
        alive &= earlier >= 0
        alive[alive] = ids[earlier[alive]] == current
        lengths[alive] += 1
    result: dict[int, int] = {}
    for token, length in zip(ids[ends + 1].tolist(), lengths.tolist()):
        if length > result.get(token, 0):
            result[token] = length
    return result


class DryPenalty:
    """The logit processor: subtracts the DRY penalty from the tokens that extend a repeat."""

    def __init__(self, settings: DrySettings) -> None:
        self.settings = settings

    def __call__(self, logits: torch.Tensor, ctx: ProcessorContext) -> None:
        s = self.settings
        for j, row in enumerate(ctx.rows):
            context = [*row.prompt_ids, *row.output_ids]
            if s.penalty_last_n:
                context = context[-s.penalty_last_n :]
            hits = {
                t: n
                for t, n in match_lengths(context, s.breaker_ids).items()
                if n >= s.allowed_length and t < logits.shape[1]
            }
            if not hits:
                continue
            tokens = torch.tensor(list(hits), dtype=torch.long, device=logits.device)
            amounts = torch.tensor([s.penalty(n) for n in hits.values()], dtype=logits.dtype, device=logits.device)
            logits[j].index_add_(0, tokens, -amounts)


def build(engine_config: Any) -> DryPenalty | None:
    """The factory: a :class:`DryPenalty`, or None (not in the pipeline) at multiplier 0."""
    options = getattr(engine_config, "plugin_options", None) or {}
    settings = DrySettings.from_options(options)
    return DryPenalty(settings) if settings.multiplier > 0 else None
