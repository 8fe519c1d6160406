"""metrale-slai: the ``slai`` scheduling policy and its two flags, as a Metrale plugin.

Owner: this module is the plugin (entry point ``metrale: slai``); the policy itself lives in
:mod:`metrale_slai.policy` and is imported only when an engine selects ``--scheduler slai``.

Invariants:
- Importing this module imports nothing heavy (no torch, no engine code).
- Every flag has a default, so ``--scheduler slai`` alone works; the values reach the policy
  through ``EngineConfig.plugin_options`` under the flags' dests.
"""

from __future__ import annotations

import argparse

from metrale_core import hookimpl
from metrale_core.components import SchedulerSpec
from metrale_core.plugins import lazy_factory

__all__ = ["DEFAULT_DEADLINE_SLACK_MS", "DEFAULT_MAX_WAIT_MS", "metrale_engine_flags",
           "metrale_schedulers"]

#: A waiting request older than this is admitted before shorter ones (anti-starvation).
DEFAULT_MAX_WAIT_MS = 5000.0
#: A request whose deadline is this close is admitted before shorter ones.
DEFAULT_DEADLINE_SLACK_MS = 1000.0


def _milliseconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of milliseconds: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 milliseconds, got {text}")
    return value


@hookimpl
def metrale_schedulers(register):
    register(SchedulerSpec(
        name="slai",
        factory=lazy_factory("metrale_slai.policy:SlaiPolicy.from_config"),
        description="deadline-aware shortest-prompt-first with aging; preempts the largest",
    ))


@hookimpl
def metrale_engine_flags(parser):
    parser.add_argument(
        "--slai-max-wait-ms", type=_milliseconds, default=DEFAULT_MAX_WAIT_MS, metavar="MS",
        help="with --scheduler slai: a request waiting this long is admitted before shorter "
             f"ones (default: {DEFAULT_MAX_WAIT_MS:g})")
    parser.add_argument(
        "--slai-deadline-slack-ms", type=_milliseconds, default=DEFAULT_DEADLINE_SLACK_MS,
        metavar="MS",
        help="with --scheduler slai: a request whose --request-timeout deadline is this close "
             f"is admitted first (default: {DEFAULT_DEADLINE_SLACK_MS:g})")
