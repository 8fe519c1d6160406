"""metrale-slai: installed, selectable with ``--scheduler slai``, and it changes the schedule.

The schedules are driven through the real engine over metrale_core.testing's recording model;
each scenario runs under FCFS and under slai and both traces are golden files beside this test,
so the difference between the two policies is reviewable line by line.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from metrale_core.cli.flags import engine_config_from_args
from metrale_core.cli.main import build_parser
from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.errors import ConfigError
from metrale_core.plugin.discovery import load_registry
from metrale_core.testing import EOS, Advance, Arrive, RecordingModel, Scenario, SeqScript, run_scenario
from metrale_core.testing.plugin_listing import met_plugins_listing
from metrale_slai.policy import SlaiPolicy


@pytest.fixture(scope="module")
def registry():
    return load_registry()


def prompt(key: int, n: int) -> list[int]:
    return list(range(key, key + n))


def admission_order(result) -> list[int]:
    """Sequence keys in the order their first prefill ran."""
    order: list[int] = []
    for call in result.model.calls:
        for seq in call.seqs:
            if seq.start == 0 and seq.key not in order:
                order.append(seq.key)
    return order


def preempted(result) -> list[int]:
    """Keys whose history was prefilled again after they had decoded (preemption by recompute)."""
    decoding, again = set(), []
    for call in result.model.calls:
        for seq in call.seqs:
            if seq.num_rows == 1:
                decoding.add(seq.key)
            elif seq.key in decoding:
                again.append(seq.key)
                decoding.discard(seq.key)
    return again


def _slai_args(registry, *flags: str):
    """``met generate hi --scheduler slai --kv-cache-memory 64K FLAGS``, parsed."""
    return build_parser(registry).parse_args(
        ["generate", "hi", "--scheduler", "slai", "--kv-cache-memory", "64K", *flags]
    )


def test_plugin_is_installed(registry):
    assert "slai" in registry.schedulers
    assert registry.provider("schedulers", "slai").distribution == "metrale-slai"
    listing = met_plugins_listing()
    assert "metrale-slai" in listing and "schedulers: slai" in listing


def test_flags_select_and_configure_the_policy(registry):
    args = _slai_args(registry, "--slai-max-wait-ms", "250", "--slai-deadline-slack-ms", "40")
    config = engine_config_from_args(args)
    assert config.scheduler == "slai"
    assert config.plugin_options["slai_max_wait_ms"] == 250.0
    engine = LLMEngine(RecordingModel([SeqScript([10], [11])]), config, registry=registry)
    policy = engine.scheduler.policy
    assert isinstance(policy, SlaiPolicy)
    assert (policy.max_wait_s, policy.deadline_slack_s) == (0.25, 0.04)
    assert policy.clock is config.clock


def test_flag_rejects_negative_milliseconds(registry, capsys):
    with pytest.raises(SystemExit):
        build_parser(registry).parse_args(["generate", "hi", "--slai-max-wait-ms", "-5"])
    assert "--slai-max-wait-ms" in capsys.readouterr().err


def test_options_set_in_code_are_validated():
    config = EngineConfig(scheduler="slai", plugin_options={"slai_max_wait_ms": -1})
    with pytest.raises(ConfigError, match="max_wait_s"):
        SlaiPolicy.from_config(config)


SHORTEST_FIRST = [  # one sequence at a time, so admission order is the whole story
    Arrive(0, "r10", prompt(10, 12), [40, 41]),
    Arrive(0, "r20", prompt(20, 4), [42, 43]),
    Arrive(0, "r30", prompt(30, 8), [44, 45]),
]
PREEMPTION = [  # 6 blocks of 4 tokens: both fit, then cannot both grow
    Arrive(0, "r10", prompt(10, 10), prompt(40, 10), max_tokens=10, ignore_eos=True),
    Arrive(0, "r20", prompt(20, 5), prompt(50, 10), max_tokens=10, ignore_eos=True),
]
SCENARIOS = {
    "shortest_first": (SHORTEST_FIRST, dict(max_num_seqs=1)),
    "preemption": (PREEMPTION, dict(num_kv_blocks=6)),
}


@pytest.mark.parametrize("policy", ["fcfs", "slai"])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_golden_schedule(registry, golden, name, policy):
    events, engine = SCENARIOS[name]
    result = run_scenario(
        Scenario(f"{name}_{policy}", events, engine={**engine, "scheduler": policy}), registry=registry
    )
    golden(f"{name}_{policy}", result.trace)
    assert result.model.errors == []
    # every client still gets exactly its script (then EOS), whatever the order
    for event in events:
        expected = list(event.output[: event.max_tokens])
        expected += [EOS] if len(expected) < event.max_tokens else []
        assert result.streams[event.request_id].token_ids == expected


def test_slai_admits_shortest_prompt_first(registry):
    def order(policy):
        return admission_order(
            run_scenario(
                Scenario("o", SHORTEST_FIRST, engine=dict(max_num_seqs=1, scheduler=policy)), registry=registry
            )
        )

    assert order("fcfs") == [10, 20, 30]
    assert order("slai") == [20, 30, 10]


def test_slai_preempts_the_sequence_holding_most_blocks(registry):
    def victims(policy):
        return preempted(
            run_scenario(Scenario("p", PREEMPTION, engine=dict(num_kv_blocks=6, scheduler=policy)), registry=registry)
        )

    assert victims("fcfs") == [20]  # FCFS: the most recently admitted
    assert victims("slai") == [10]  # slai: the one holding 4 blocks against 3


def _aging(max_wait_ms: float, advance_s: float) -> list[Arrive | Advance]:
    # r0 holds the only slot for a while; r10 (long) waits from step 0, r20 (short) from step 2
    return [
        Arrive(0, "r0", prompt(0 + 5, 2), [40, 41, 42, 43, 44]),
        Arrive(0, "r10", prompt(10, 12), [45]),
        Advance(1, advance_s),
        Arrive(2, "r20", prompt(20, 3), [46]),
    ]


@pytest.mark.parametrize("advance_s,expected", [(0.0, [5, 20, 10]), (6.0, [5, 10, 20])])
def test_a_request_waiting_past_max_wait_goes_first(registry, advance_s, expected):
    events = _aging(5000, advance_s)
    result = run_scenario(
        Scenario(
            "aging", events, engine=dict(max_num_seqs=1, scheduler="slai", plugin_options={"slai_max_wait_ms": 5000})
        ),
        registry=registry,
    )
    assert admission_order(result) == expected


@pytest.mark.parametrize("advance_s,expected", [(3.0, [5, 20, 10]), (4.5, [5, 10, 20])])
def test_a_request_near_its_deadline_goes_first(registry, advance_s, expected):
    # r10 must finish within 6 s; with 1 s of slack it is due from t = 5 s (max wait is far off)
    events = [
        Arrive(0, "r0", prompt(5, 2), [40, 41, 42, 43, 44]),
        Arrive(0, "r10", prompt(10, 12), [45], timeout_s=6.0),
        Advance(1, advance_s),
        Arrive(2, "r20", prompt(20, 3), [46]),
        Advance(3, 1.0),
    ]
    result = run_scenario(
        Scenario(
            "deadline",
            events,
            engine=dict(
                max_num_seqs=1,
                scheduler="slai",
                plugin_options={"slai_max_wait_ms": 60_000, "slai_deadline_slack_ms": 1000},
            ),
        ),
        registry=registry,
    )
    assert admission_order(result) == expected
    assert result.streams["r10"].finish_reason == "stop"


def test_resumed_sequences_come_before_new_ones():
    def seq(order, n, preemptions=0):
        return SimpleNamespace(
            order=order,
            num_prefill_tokens=n,
            num_preemptions=preemptions,
            request=SimpleNamespace(arrival_time=0.0),
            deadline=None,
        )

    policy = SlaiPolicy(max_wait_s=100.0, deadline_slack_s=1.0, clock=lambda: 0.0)
    fresh_short, resumed_long, resumed_short = seq(0, 2), seq(1, 30, 1), seq(2, 20, 2)
    assert policy.next_waiting([fresh_short, resumed_long, resumed_short]) is resumed_short
    assert policy.next_waiting([fresh_short]) is fresh_short


# --- TBT hold-back -------------------------------------------------------------------------


def test_tbt_flags_configure_the_hold_back(registry):
    args = _slai_args(registry, "--slai-tbt-budget-ms", "40", "--slai-step-tokens-per-ms", "2.5")
    config = engine_config_from_args(args)
    engine = LLMEngine(RecordingModel([SeqScript([10], [11])]), config, registry=registry)
    policy = engine.scheduler.policy
    assert (policy.tbt_budget_s, policy.step_tokens_per_s) == (0.04, 2500.0)
    default = SlaiPolicy.from_config(EngineConfig(scheduler="slai"))
    assert default.tbt_budget_s == 0.0  # off unless asked for


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "fast"])
def test_step_tokens_per_ms_must_be_positive(registry, capsys, value):
    with pytest.raises(SystemExit):
        build_parser(registry).parse_args(["generate", "hi", "--slai-step-tokens-per-ms", value])
    assert "--slai-step-tokens-per-ms" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="step_tokens_per_s"):
        SlaiPolicy(step_tokens_per_s=0.0)


def _seq(order, n, preemptions=0, arrival=0.0, deadline=None):
    return SimpleNamespace(
        order=order,
        num_prefill_tokens=n,
        num_preemptions=preemptions,
        request=SimpleNamespace(arrival_time=arrival),
        deadline=deadline,
    )


def test_hold_back_cost_model():
    from metrale_core.engine import AdmissionStep

    # 5 ms at 1 token/ms: a step with decodes may feed 5 tokens
    policy = SlaiPolicy(max_wait_s=10.0, clock=lambda: 0.0, tbt_budget_s=0.005, step_tokens_per_s=1000.0)
    two_decodes = AdmissionStep(num_decodes=2, num_decode_tokens=2, num_prefill_tokens=0, budget=64)
    short, long = _seq(0, 3), _seq(1, 4)
    assert policy.step_time_s(long, two_decodes) == pytest.approx(0.006)
    assert policy.next_waiting([long, short], step=two_decodes) is short  # 2 + 3 tokens
    assert policy.next_waiting([long], step=two_decodes) is None  # 2 + 4 tokens
    # prefill already scheduled this step counts; the first chunk is capped by the budget left
    busy = AdmissionStep(num_decodes=1, num_decode_tokens=1, num_prefill_tokens=2, budget=64)
    assert policy.next_waiting([short], step=busy) is None  # 1 + 2 + 3
    capped = AdmissionStep(num_decodes=1, num_decode_tokens=1, num_prefill_tokens=2, budget=2)
    assert policy.next_waiting([long], step=capped) is long  # 1 + 2 + 2
    # nothing decoding, no step given, or the budget off: never held back
    prefill_only = AdmissionStep(num_decodes=0, num_decode_tokens=0, num_prefill_tokens=60, budget=4)
    assert policy.next_waiting([long], step=prefill_only) is long
    assert policy.next_waiting([long]) is long
    off = SlaiPolicy(max_wait_s=10.0, clock=lambda: 0.0, step_tokens_per_s=1000.0)
    assert off.next_waiting([_seq(0, 1000)], step=two_decodes).order == 0
    # preempted and due sequences are never held back
    huge = AdmissionStep(num_decodes=8, num_decode_tokens=8, num_prefill_tokens=0, budget=64)
    resumed = _seq(2, 50, preemptions=1)
    assert policy.next_waiting([short, resumed], step=huge) is resumed
    aged = _seq(3, 50, arrival=-10.0)
    assert policy.next_waiting([short, aged], step=huge) is aged
    near_deadline = _seq(4, 50, deadline=0.5)
    assert policy.next_waiting([short, near_deadline], step=huge) is near_deadline
    assert policy.next_waiting([short], step=huge) is None


# r0 decodes from step 1 to step 5 (EOS at forward #5); r10 (long) and r20 (short) arrive at
# step 1.  With 5 ms at 1 token/ms, r20 (1 decode + 3) fits beside r0, r10 (8 tokens) does not.
TBT_OPTIONS = {"slai_tbt_budget_ms": 5.0, "slai_step_tokens_per_ms": 1.0, "slai_max_wait_ms": 5000.0}


def _tbt_events(advance: list | None = None) -> list:
    return [
        Arrive(0, "r0", prompt(5, 2), [40, 41, 42, 43, 44]),
        Arrive(1, "r10", prompt(10, 8), [45]),
        Arrive(1, "r20", prompt(20, 3), [46]),
        *(advance or []),
    ]


def _run_tbt(registry, events, options):
    result = run_scenario(
        Scenario("tbt", events, engine=dict(scheduler="slai", plugin_options=options)), registry=registry
    )
    assert result.model.errors == []
    for event in events:
        if isinstance(event, Arrive):
            assert result.streams[event.request_id].token_ids == list(event.output) + [EOS]
    return result


def test_tbt_hold_back_waits_for_the_decodes_to_finish(registry):
    held = _run_tbt(registry, _tbt_events(), TBT_OPTIONS)
    # r20 goes in beside r0 at once; r10 only after r0's last decode (forward #5)
    assert held.model.first_prefill() == {5: 0, 20: 1, 10: 6}
    # every forward while r0 decoded fed at most 5 tokens
    assert all(sum(s.num_rows for s in call.seqs) <= 5 for call in held.model.calls[1:6])
    # off: the same requests are admitted as they arrive
    free = _run_tbt(registry, _tbt_events(), {**TBT_OPTIONS, "slai_tbt_budget_ms": 0.0})
    assert free.model.first_prefill() == {5: 0, 20: 1, 10: 1}


def test_tbt_hold_back_stops_when_the_request_is_due(registry):
    # the clock passes r10's max wait (5 s) before step 3: due requests are never held back
    held = _run_tbt(registry, _tbt_events([Advance(3, 6.0)]), TBT_OPTIONS)
    assert held.model.first_prefill() == {5: 0, 20: 1, 10: 3}
    r0_steps = [call.index for call in held.model.calls for s in call.seqs if s.key == 5]
    assert r0_steps == [0, 1, 2, 3, 4, 5]  # r0 decoded through it all


def test_tbt_off_leaves_the_schedule_unchanged(registry):
    events = _tbt_events([Advance(3, 6.0)])
    default = run_scenario(Scenario("tbt", events, engine=dict(scheduler="slai")), registry=registry)
    off = run_scenario(
        Scenario(
            "tbt",
            events,
            engine=dict(scheduler="slai", plugin_options={"slai_tbt_budget_ms": 0.0, "slai_step_tokens_per_ms": 1.0}),
        ),
        registry=registry,
    )
    assert off.trace == default.trace
    assert default.model.first_prefill() == {5: 0, 20: 1, 10: 1}
