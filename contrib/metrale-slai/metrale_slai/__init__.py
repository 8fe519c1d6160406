"""metrale-slai: the ``slai`` scheduling policy and its flags, as a Metrale plugin.

Owner: this module is the plugin (entry point ``metrale: slai``); the policy itself lives in
:mod:`metrale_slai.policy` and is imported only when an engine selects ``--scheduler slai``.

Invariants:
- Importing this module imports nothing heavy (no torch, no engine code).
- Every flag has a default, so ``--scheduler slai`` alone works; the values reach the policy
  through ``EngineConfig.plugin_options`` under the flags' dests.
"""

from __future__ import annotations

from metrale_core import hookimpl
from metrale_core.api import SchedulerSpec, lazy_factory, number_type

__all__ = [
    "DEFAULT_DEADLINE_SLACK_MS",
    "DEFAULT_MAX_WAIT_MS",
    "DEFAULT_STEP_TOKENS_PER_MS",
    "DEFAULT_TBT_BUDGET_MS",
    "metrale_engine_flags",
    "metrale_schedulers",
]

#: A waiting request older than this is admitted before shorter ones (anti-starvation).
DEFAULT_MAX_WAIT_MS = 5000.0
#: A request whose deadline is this close is admitted before shorter ones.
DEFAULT_DEADLINE_SLACK_MS = 1000.0
#: New prefills are held back while a step with decodes would take longer than this (0 = never).
DEFAULT_TBT_BUDGET_MS = 0.0
#: The hold-back's cost model: tokens (decode rows + prefill tokens) one step feeds per ms.
DEFAULT_STEP_TOKENS_PER_MS = 10.0


_milliseconds = number_type(float, lambda value: value >= 0, ">= 0 milliseconds", "a number of milliseconds")
_tokens_per_ms = number_type(
    float, lambda value: 0 < value < float("inf"), "> 0 tokens per ms", "a number of tokens per ms"
)


@hookimpl
def metrale_schedulers(register):
    register(
        SchedulerSpec(
            name="slai",
            factory=lazy_factory("metrale_slai.policy:SlaiPolicy.from_config"),
            description="deadline-aware shortest-prompt-first with aging; preempts the largest",
        )
    )


@hookimpl
def metrale_engine_flags(parser):
    parser.add_argument(
        "--slai-max-wait-ms",
        type=_milliseconds,
        default=DEFAULT_MAX_WAIT_MS,
        metavar="MS",
        help="with --scheduler slai: a request waiting this long is admitted before shorter "
        f"ones (default: {DEFAULT_MAX_WAIT_MS:g})",
    )
    parser.add_argument(
        "--slai-deadline-slack-ms",
        type=_milliseconds,
        default=DEFAULT_DEADLINE_SLACK_MS,
        metavar="MS",
        help="with --scheduler slai: a request whose --request-timeout deadline is this close "
        f"is admitted first (default: {DEFAULT_DEADLINE_SLACK_MS:g})",
    )
    parser.add_argument(
        "--slai-tbt-budget-ms",
        type=_milliseconds,
        default=DEFAULT_TBT_BUDGET_MS,
        metavar="MS",
        help="with --scheduler slai: while sequences are decoding, hold back new prefills that "
        "would make the step's estimated time exceed this time-between-tokens budget "
        f"(default: {DEFAULT_TBT_BUDGET_MS:g} = never)",
    )
    parser.add_argument(
        "--slai-step-tokens-per-ms",
        type=_tokens_per_ms,
        default=DEFAULT_STEP_TOKENS_PER_MS,
        metavar="N",
        help="with --slai-tbt-budget-ms: tokens one engine step feeds per millisecond, the "
        f"step-time estimate (default: {DEFAULT_STEP_TOKENS_PER_MS:g})",
    )
