"""``PositionKind``: which kind of position a row of logits belongs to.

Owner: the output processor tags every logits row with one kind; the logit pipeline runs a
processor only on the kinds it declares.
"""

from __future__ import annotations

import enum

__all__ = ["PositionKind"]


class PositionKind(enum.Enum):
    """The kind of a logits row."""

    #: The last position of a prompt's prefill: the first output token is sampled here.
    PREFILL_LAST = "prefill_last"
    #: A plain decode position whose sampled token is committed.
    FINAL_DECODE = "final_decode"
    #: A speculative verify position whose token may still be rejected.
    VERIFY = "verify"
