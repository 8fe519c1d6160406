"""Which LoRA adapter a sequence runs with: ``seq.extras[ADAPTER_EXTRA]`` (absent: the base).

Owner: the multi-LoRA seam (``metrale_core.engine.adapters``).  Kept apart, import-light, so the
block manager and scheduler can read a sequence's adapter without importing the LoRA layers.

Invariants: the value is an ``AdapterBank`` key (``name@serial``), never a bare name.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ADAPTER_EXTRA", "adapter_of"]

#: Key of ``Sequence.extras`` holding the sequence's adapter key.
ADAPTER_EXTRA = "lora_adapter"


def adapter_of(seq: Any) -> str | None:
    """The adapter key a sequence runs with (None: the base model)."""
    extras = getattr(seq, "extras", None)
    return None if not extras else extras.get(ADAPTER_EXTRA)
