"""Metrale plugin: speculative decoding (n-gram, draft model, MTP heads) with a throughput gate.

Owner: ``metrale_speculative``.  Registers the proposers ``ngram``, ``draft`` and ``mtp``
through ``metrale_speculative_proposers``, the flags ``--speculative``, ``--num-draft-tokens``,
``--draft-model`` and ``--spec-gate`` through ``metrale_engine_flags``, the
``metrale:spec_decode_*`` counters through ``metrale_metrics`` and, on every engine with a
speculator, the dashboard's ``speculative`` extra (acceptance) through ``metrale_engine_started``.
The engine side (verify chunks, the acceptance rule, KV / recurrent rollback) lives in
``metrale_core.engine.speculation``.

Invariants: importing this package imports neither torch nor a model (factories are lazy).
"""

from __future__ import annotations

from metrale_core import hookimpl
from metrale_core.api import ProposerSpec, lazy_factory

__all__ = ["metrale_engine_flags", "metrale_engine_started", "metrale_metrics", "metrale_speculative_proposers"]

_PROPOSERS = {
    "ngram": "prompt lookup: copy what followed the longest earlier match of the context's suffix",
    "draft": "a smaller model with the same tokenizer drafts k tokens (--draft-model PATH)",
    "mtp": "the checkpoint's DeepSeek-style MTP layer drafts k tokens (--draft-model PATH)",
}


@hookimpl
def metrale_speculative_proposers(register) -> None:
    """Register the ngram, draft and mtp proposers."""
    for name, description in _PROPOSERS.items():
        register(
            ProposerSpec(
                name=name, factory=lazy_factory(f"metrale_speculative.factories:make_{name}"), description=description
            )
        )


@hookimpl
def metrale_engine_flags(parser) -> None:
    """``--speculative``, ``--num-draft-tokens``, ``--draft-model``, ``--spec-gate``."""
    parser.add_argument(
        "--speculative", choices=tuple(_PROPOSERS), default=None, help="speculative decoding proposer (default: off)"
    )
    parser.add_argument(
        "--num-draft-tokens", type=int, default=4, metavar="K", help="draft tokens verified per step (default: 4)"
    )
    parser.add_argument(
        "--draft-model",
        default=None,
        metavar="PATH",
        help="checkpoint of the draft model (draft) or with the MTP layer (mtp)",
    )
    parser.add_argument(
        "--spec-gate",
        choices=("auto", "force"),
        default="auto",
        help="auto: turn speculation off per batch width while it delivers fewer "
        "tokens/s than plain decode; force: always speculate (default: auto)",
    )


def _speculator_stats(engine):
    """The ``SpecStats`` of the engine's speculator; None when speculation is off (or the
    speculator keeps none)."""
    driver = getattr(engine, "spec_driver", None)
    return getattr(getattr(driver, "speculator", None), "stats", None)


@hookimpl
def metrale_metrics(engine):
    """The ``metrale:spec_decode_*`` counters of the engine's speculator (None when off)."""
    stats = _speculator_stats(engine)
    return None if stats is None else stats.metrics()


@hookimpl
def metrale_engine_started(engine) -> None:
    """Publish the speculator's acceptance as the ``speculative`` extra (speculation on only)."""
    stats = _speculator_stats(engine)
    if stats is not None:
        from metrale_speculative.spec_stats import describe_summary

        engine.snapshots.add_extras_provider("speculative", stats.summary, label="speculative", format=describe_summary)
