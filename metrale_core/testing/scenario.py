"""Scenario runner: drive the real ``LLMEngine`` over a ``RecordingModel`` and write one trace.

A :class:`Scenario` is a small script of events keyed by engine step: requests arriving (with the
prompt and the tokens the fake model answers for them), aborts, fake-clock advances.  The runner
applies the events due before each ``engine.step()`` and records, in order: the events, every
model forward (and the model's error lines), every output the engine returned, the engine's
queue and pool sizes after the step (``~ running= waiting= free_blocks=``), and at the end
each client's whole stream (token ids, finish reason, error).

Owner: scheduler golden-trace tests (tests/scheduler) and plugin tests that reuse it.
Invariants: the trace is deterministic: no timings, ids or addresses; the fake clock only moves
on ``Advance`` events; a step that raises a ``MetraleError`` is recorded and handled the way a
driver does (``LLMEngine.fail_in_flight``: the sequences of that step finish with "error");
the runner stops when no request is unfinished and no event is left, or
after ``max_steps`` (recorded as a line, so a hang shows in the trace instead of looping).
"""

from __future__ import annotations

from collections.abc import Sequence

from attrs import define, field, frozen

from metrale_core.errors import MetraleError
from metrale_core.sampling.params import SamplingParams
from metrale_core.testing.clock import FakeClock
from metrale_core.testing.recording_model import GARBAGE, RecordingModel, SeqScript

__all__ = ["Abort", "Advance", "Arrive", "ClientStream", "Scenario", "ScenarioResult", "run_scenario", "scripts_of"]


def _ids(values) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


@frozen
class Arrive:
    """A request arriving before engine step ``step``; the model answers ``output`` for it."""

    step: int
    request_id: str
    prompt: tuple[int, ...] = field(converter=_ids)
    output: tuple[int, ...] = field(converter=_ids)
    max_tokens: int = 16
    ignore_eos: bool = False
    timeout_s: float | None = None

    def describe(self) -> str:
        text = f"+ arrive {self.request_id} prompt_len={len(self.prompt)} max_tokens={self.max_tokens}"
        if self.ignore_eos:
            text += " ignore_eos"
        if self.timeout_s is not None:
            text += f" timeout_s={self.timeout_s:g}"
        return text


@frozen
class Abort:
    """A client cancelling ``request_id`` before engine step ``step``."""

    step: int
    request_id: str

    def describe(self) -> str:
        return f"+ abort {self.request_id}"


@frozen
class Advance:
    """The fake clock moving ``seconds`` forward before engine step ``step``."""

    step: int
    seconds: float

    def describe(self) -> str:
        return f"+ clock +{self.seconds:g}s"


Event = Arrive | Abort | Advance


@frozen
class Scenario:
    """What to run: events, engine config overrides and model options."""

    name: str
    events: tuple[Event, ...] = field(converter=tuple)
    #: ``EngineConfig`` keyword overrides (the clock is always the scenario's fake clock).
    engine: dict = field(factory=dict)
    #: ``RecordingModel`` keyword options (``fail_kv_at_steps``, ``recurrent_fed_rows``, ...).
    model: dict = field(factory=dict)
    #: A speculator (or factory ``f(ProposerContext)``) for ``LLMEngine(speculator=...)``;
    #: None runs without speculative decoding.
    speculator: object = field(default=None, eq=False)
    max_steps: int = 200


@define
class ClientStream:
    """Everything one client received."""

    request_id: str
    token_ids: list[int] = field(factory=list)
    finish_reason: str | None = None
    error: str | None = None
    finished: bool = False

    def render(self) -> str:
        tokens = " ".join("GARBAGE" if t == GARBAGE else str(t) for t in self.token_ids)
        end = f"{self.finish_reason}" if self.finished else "UNFINISHED"
        text = f"{self.request_id}: [{tokens}] {end} n={len(self.token_ids)}"
        return text + (f" error={self.error!r}" if self.error else "")


@frozen
class ScenarioResult:
    trace: str
    streams: dict[str, ClientStream]
    model: RecordingModel
    steps: int


def _defaults(overrides: dict) -> dict:
    config = dict(block_size=4, num_kv_blocks=64, max_prefill_tokens=64, max_num_seqs=8)
    config.update(overrides)
    return config


def _render_output(out) -> str:
    tokens = ",".join("GARBAGE" if t == GARBAGE else str(t) for t in out.new_token_ids)
    text = f"out {out.request_id} +[{tokens}]"
    if out.finished:
        text += f" finished={out.finish_reason}"
    if out.error:
        text += f" error={out.error!r}"
    return text


def _render_stats(stats) -> str:
    return (
        f"~ running={stats.num_running} waiting={stats.num_waiting} "
        f"free_blocks={stats.num_free_blocks}/{stats.num_blocks}"
    )


def run_scenario(scenario: Scenario, registry=None) -> ScenarioResult:
    """Run ``scenario`` against a fresh engine and model; see the module docstring.

    ``registry`` (from ``load_registry()``) lets ``scenario.engine`` name plugin components,
    e.g. ``{"scheduler": "slai"}``; without one only the core's FCFS policy is available.
    """
    from metrale_core.engine.config import EngineConfig
    from metrale_core.engine.engine import LLMEngine

    model = RecordingModel(scripts_of(scenario.events), **scenario.model)
    clock = FakeClock()
    engine = LLMEngine(
        model,
        EngineConfig(clock=clock, **_defaults(scenario.engine)),
        registry=registry,
        speculator=scenario.speculator,
    )
    lines = [f"# scenario {scenario.name}"]
    streams: dict[str, ClientStream] = {}
    seen = 0
    last = max((e.step for e in scenario.events), default=0)
    step = 0
    while True:
        if step >= scenario.max_steps:
            lines.append(f"!! stopped after max_steps={scenario.max_steps}")
            break
        due = [e for e in scenario.events if e.step == step]
        if step > last and not due and not engine.has_unfinished():
            break
        lines.append(f"-- step {step}")
        for event in due:
            lines.append(event.describe())
            _apply(engine, clock, event, streams, lines)
        try:
            outputs = engine.step()
        except MetraleError as exc:
            # what a driver (AsyncEngine) does after a failed step: fail the in-flight sequences
            lines.extend(model.lines[seen:])
            seen = len(model.lines)
            lines.append(f"!! engine.step raised {type(exc).__name__}: {exc}")
            outputs = engine.fail_in_flight(f"{type(exc).__name__}: {exc}")
        lines.extend(model.lines[seen:])
        seen = len(model.lines)
        for out in outputs:
            lines.append(_render_output(out))
            stream = streams.setdefault(out.request_id, ClientStream(out.request_id))
            stream.token_ids.extend(out.new_token_ids)
            if out.finished:
                stream.finished = True
                stream.finish_reason = out.finish_reason
                stream.error = out.error
        lines.append(_render_stats(engine.stats()))
        step += 1
    lines.append("== client streams")
    lines.extend(streams[rid].render() for rid in sorted(streams))
    return ScenarioResult(trace="\n".join(lines) + "\n", streams=streams, model=model, steps=step)


def _apply(engine, clock: FakeClock, event: Event, streams: dict[str, ClientStream], lines: list[str]) -> None:
    if isinstance(event, Advance):
        clock.advance(event.seconds)
    elif isinstance(event, Abort):
        engine.abort(event.request_id)
    else:
        streams[event.request_id] = ClientStream(event.request_id)
        params = SamplingParams(temperature=0.0, max_tokens=event.max_tokens, ignore_eos=event.ignore_eos)
        try:
            engine.add_request(event.request_id, list(event.prompt), params, timeout_s=event.timeout_s)
        except Exception as exc:  # a refused request is part of what the client sees
            stream = streams[event.request_id]
            stream.finished, stream.finish_reason, stream.error = True, "refused", f"{type(exc).__name__}: {exc}"
            lines.append(f"!! add_request refused {event.request_id}: {type(exc).__name__}: {exc}")


def scripts_of(events: Sequence[Event]) -> list[SeqScript]:
    """The model scripts a list of events implies (one per arrival)."""
    return [SeqScript(e.prompt, e.output) for e in events if isinstance(e, Arrive)]
