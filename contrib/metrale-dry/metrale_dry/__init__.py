"""metrale-dry: the DRY repeat penalty and its flags, as a Metrale plugin.

Owner: this module is the plugin (entry point ``metrale: dry``); the penalty lives in
:mod:`metrale_dry.penalty` and is imported only when an engine is built.

Invariants:
- Importing this module imports nothing heavy (no torch, no numpy).
- Off unless ``--dry-multiplier`` is above 0: the factory then returns None and the processor
  is not in the engine's pipeline at all (no per-step cost).
"""

from __future__ import annotations

import argparse

from metrale_core import hookimpl
from metrale_core.api import LogitProcessorSpec, PositionKind, lazy_factory

__all__ = ["DEFAULTS", "FLAGS", "metrale_engine_flags", "metrale_logit_processors"]


def _token_ids(text: str) -> tuple[int, ...]:
    try:
        ids = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids, got {text!r}") from None
    if any(i < 0 for i in ids):
        raise argparse.ArgumentTypeError(f"token ids must be >= 0, got {text!r}")
    return ids


@hookimpl
def metrale_logit_processors(register):
    register(
        LogitProcessorSpec(
            name="dry",
            factory=lazy_factory("metrale_dry.penalty:build"),
            order=200,
            kinds={PositionKind.PREFILL_LAST, PositionKind.FINAL_DECODE},
            description="DRY penalty on tokens that extend a verbatim repeat (--dry-multiplier)",
        )
    )


#: The flags: dest, default, type, metavar, help (``--dry-multiplier`` for ``dry_multiplier``).
FLAGS: tuple[tuple[str, object, object, str, str], ...] = (
    ("dry_multiplier", 0.0, float, "X", "DRY repeat penalty strength; 0 turns it off (default: 0)"),
    ("dry_base", 1.75, float, "X", "DRY: growth of the penalty per repeated token (default: 1.75)"),
    ("dry_allowed_length", 2, int, "N", "DRY: repeats up to this long are free (default: 2)"),
    ("dry_penalty_last_n", 0, int, "N", "DRY: look back this many tokens; 0 = whole context (default: 0)"),
    (
        "dry_breaker_ids",
        (),
        _token_ids,
        "IDS",
        "DRY: comma-separated token ids no repeat may span (e.g. the newline token)",
    ),
)
#: Flag dest -> default (also what ``DrySettings.from_options`` falls back to).
DEFAULTS = {dest: default for dest, default, *_ in FLAGS}


@hookimpl
def metrale_engine_flags(parser):
    for dest, default, kind, metavar, help_text in FLAGS:
        parser.add_argument("--" + dest.replace("_", "-"), type=kind, default=default, metavar=metavar, help=help_text)
