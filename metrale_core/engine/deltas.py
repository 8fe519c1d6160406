"""``RequestOutput``: one delta of one request's stream, and the merging of consecutive deltas.

Owner: ``metrale_core.engine`` (the output processor makes them; the async engine, the data-parallel
client and the server consume them).  A module of its own so that everything that makes or reads
deltas (the verifier, pooling, the async engine) depends on this record only, not on the output
processor.

Invariants:
- A delta is immutable; merging never changes its inputs.
- ``merge_outputs`` of one delta is that delta; the merged delta's finish, counts and ``steps``
  are the last one's.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

from attrs import evolve, frozen

__all__ = ["RequestOutput", "coalesce", "merge_outputs"]


@frozen
class RequestOutput:
    """One delta of one request's stream."""

    request_id: str
    #: Token ids generated this step (including a final EOS / stop token).
    new_token_ids: tuple[int, ...] = ()
    #: Text added this step (held-back and stop text excluded).
    text_delta: str = ""
    finished: bool = False
    #: "stop" | "length" | "abort" | "timeout" | "error" once finished, else None.
    finish_reason: str | None = None
    #: What went wrong when ``finish_reason`` is "error".
    error: str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    #: When the request asked for logprobs: per new token ``(token_id, logprob, top)`` with
    #: ``top`` a tuple of ``(token_id, logprob)`` pairs, most likely first; else None.
    logprobs: tuple | None = None
    #: The ``ParsedDelta`` pieces of ``text_delta`` when the request has a ``stream_parser`` extra
    #: (``metrale_core.streamparse``); the final delta includes what ``finish()`` flushed.
    parsed: tuple = ()
    #: The pooled, L2-normalised vector of a pooling (embedding) request's final delta
    #: (``metrale_core.engine.pooling``); None otherwise.
    embedding: Any = None
    #: Engine steps whose tokens this delta carries: 1, more when a consumer that fell behind got
    #: several steps' deltas coalesced into one (``AsyncEngine.generate``); the server's
    #: inter-token latency counts one observation per step, however the deltas were delivered.
    steps: int = 1


def merge_outputs(outputs: Seq[RequestOutput]) -> RequestOutput:
    """One delta equal to consecutive deltas of the same request in order: tokens, text, logprobs
    and parsed pieces concatenated, everything else (finish, counts, ``steps``) from the last."""
    if len(outputs) == 1:
        return outputs[0]
    changes: dict[str, Any] = {
        "new_token_ids": sum((tuple(o.new_token_ids) for o in outputs), ()),
        "text_delta": "".join(o.text_delta for o in outputs),
        "parsed": sum((tuple(o.parsed or ()) for o in outputs), ()),
    }
    if any(o.logprobs is not None for o in outputs):
        changes["logprobs"] = sum((tuple(o.logprobs or ()) for o in outputs), ())
    return evolve(outputs[-1], **changes)


def coalesce(outputs: Seq[RequestOutput]) -> RequestOutput:
    """:func:`merge_outputs` of deltas handed over together, with ``steps`` the engine steps they
    span (the steps of those with tokens; at least 1)."""
    if len(outputs) == 1:
        return outputs[0]
    steps = sum(o.steps for o in outputs if o.new_token_ids)
    return evolve(merge_outputs(outputs), steps=max(steps, 1))
