"""Give an engine its LoRA adapter bank: wrap the model's declared projections, hang the bank on the runner.

Owner: ``metrale_lora``; ``metrale_engine_started`` calls :func:`enable_adapters` (tests and the
benchmark call it directly).

Invariants: calling it twice on one engine returns the first bank; the scheduler then admits at
most ``max_loras`` distinct adapters at once (``Scheduler.max_adapters``), so a step never needs
more slots than the wrappers have.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from metrale_core.api import AdapterBank, AdapterWeights, ConfigError, LoRARows, active_rows, attach_lora

__all__ = ["enable_adapters"]


def enable_adapters(
    engine: Any, max_loras: int, max_rank: int, loader: Callable[[str], AdapterWeights] | None = None
) -> AdapterBank:
    """The bank of ``engine`` (built on first call; also ``engine.runner.lora``)."""
    import torch

    runner = engine.runner
    existing = getattr(runner, "lora", None)
    if existing is not None:
        return existing
    if max_loras < 1 or max_rank < 1:
        raise ConfigError(f"--max-loras and --max-lora-rank must be at least 1 (got {max_loras}, {max_rank})")
    model = runner.model
    device = runner.device
    targets = attach_lora(model, max_loras, max_rank, getattr(model, "dtype", None) or torch.float32, device)
    if not targets:
        raise ConfigError(
            f"the model {type(model).__name__} has no projection LoRA can wrap (its lora_targets() declares none)"
        )

    def row_scope(slots: list[int] | None):
        return active_rows(None if slots is None else LoRARows.from_slots(slots, device))

    bank = AdapterBank(targets, max_loras, max_rank, row_scope, loader)
    runner.lora = bank
    engine.scheduler.max_adapters = max_loras
    return bank
