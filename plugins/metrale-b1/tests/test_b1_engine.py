"""The observer inside the real engine: the recording fake model answers a hermes tool call one
piece per token, every position with a top-1/top-2 gap of exactly 1.0; the count is the number of
committed positions sampled inside an argument value that already emitted characters.  With
speculative decoding (drafts that are all rejected, or all accepted) the count is the same:
verify positions are never counted, each committed position exactly once."""

from __future__ import annotations

import attrs
import pytest
from b1_testlib import GapModel, PieceTokenizer, SpecRegistry, observer_spec

from metrale_b1.b1_margin import B1Stats
from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.engine.speculation import Draft
from metrale_core.sampling import SamplingParams
from metrale_core.streamparse import make_stream_parser
from metrale_core.testing.recording_model import EOS, RecordingModel, SeqScript

RUNNER_UP = 0  # decodes to nothing, never answered
PIECES = [
    "",
    "",
    "",
    "<tool_call>",
    "\n",
    '{"name": "',
    "get_weather",
    '", "arguments": {"',
    "city",
    '": "',
    "Pa",
    "ris",
    '", "',
    "days",
    '": ',
    "1",
    "2",
    "}}",
    "\n",
    "</tool_call>",
    "It",
    " is",
    " sunny",
    ".",
]
TOKEN = {p: i for i, p in enumerate(PIECES) if i >= 3}
CALL = [TOKEN[p] for p in PIECES[3:20]]  # "<tool_call>" .. "</tool_call>"
PLAIN = [TOKEN[p] for p in PIECES[20:]]  # "It is sunny."
#: Positions sampled inside a value with characters: after "Pa" ("ris"), after "Paris" ('", "'),
#: after "1" ("2"), after "12" ("}}").
EXPECTED = 4
GREEDY = SamplingParams(temperature=0.0, max_tokens=64)


class FixedDrafts:
    """A speculator proposing, for every decoding sequence, either the script's next tokens
    (all accepted) or a token the model never answers (all rejected)."""

    wants_hidden = False

    def __init__(self, scripts, *, correct: bool, k: int = 3) -> None:
        self.scripts = {s.key: s for s in scripts}
        self.correct = correct
        self.k = k
        self.verified = 0

    def propose(self, seqs, max_drafts):
        drafts = []
        for seq, cap in zip(seqs, max_drafts):
            n = min(self.k, cap)
            if self.correct:
                rest = self.scripts[seq.prompt_ids[0]].output[len(seq.output_ids) :]
                tokens = tuple(rest[:n])
            else:
                tokens = (RUNNER_UP,) * n
            drafts.append(Draft(tokens) if tokens else None)
        return drafts

    def observe(self, report) -> None:
        self.verified += len(report.outcomes)


def run(speculator_kind: str | None) -> tuple[B1Stats, dict, object]:
    scripts = [SeqScript([40, 41], CALL), SeqScript([42], PLAIN), SeqScript([43], CALL)]
    stats = B1Stats()
    model = GapModel(RecordingModel(scripts, vocab_size=64), gap=1.0, runner_up=RUNNER_UP)
    speculator = None if speculator_kind is None else FixedDrafts(scripts, correct=speculator_kind == "accepted")
    engine = LLMEngine(
        model,
        EngineConfig(block_size=4, num_kv_blocks=64, max_num_seqs=8),
        tokenizer=PieceTokenizer(PIECES, EOS),
        registry=SpecRegistry(observer_spec(stats)),
        speculator=speculator,
    )
    parser = lambda: {"stream_parser": make_stream_parser(tool_parser="hermes")}
    engine.add_request("call", [40, 41], GREEDY, extras=parser())
    engine.add_request("plain", [42], GREEDY, extras=parser())  # a parser, but no tool call
    engine.add_request("no-parser", [43], GREEDY)  # a call nobody parses
    outputs: dict[str, list] = {}
    while engine.has_unfinished():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    assert not model.inner.errors
    return stats, outputs, speculator


def test_exact_count_over_the_engine():
    stats, outputs, _ = run(None)
    assert [t for o in outputs["call"] for t in o.new_token_ids] == CALL + [EOS]
    assert stats.b1_low_margin == EXPECTED
    # the observer's per-engine state is its own counter only (no speculative counters shared)
    assert [f.name for f in attrs.fields(B1Stats) if not f.name.startswith("_")] == ["b1_low_margin"]


@pytest.mark.parametrize("drafts", ["rejected", "accepted"])
def test_speculative_decoding_counts_committed_positions_only(drafts):
    stats, outputs, speculator = run(drafts)
    assert [t for o in outputs["call"] for t in o.new_token_ids] == CALL + [EOS]
    assert speculator.verified > 0
    assert stats.b1_low_margin == EXPECTED


def test_observer_off_counts_nothing():
    from metrale_core.engine.engine import build_pipeline
    from metrale_core.plugin.discovery import load_registry

    registry = load_registry()
    on = build_pipeline(EngineConfig(), registry)
    off = build_pipeline(EngineConfig(plugin_options={"b1_observer": "off"}), registry)
    assert "b1-margin" in on.processor_names and "b1-margin" not in off.processor_names


def test_count_is_published_as_the_b1_count_extra_and_shown_on_the_stats_tab():
    """Built with the installed plugins (``metrale_engine_started``), the engine publishes its
    own observer's count each step; with the observer off it publishes nothing."""
    from metrale_b1.b1_margin import low_margin_count
    from metrale_core.plugin.discovery import load_registry

    registry = load_registry()
    scripts = [SeqScript([40, 41], CALL)]
    model = GapModel(RecordingModel(scripts, vocab_size=64), gap=1.0, runner_up=RUNNER_UP)
    engine = LLMEngine(
        model,
        EngineConfig(block_size=4, num_kv_blocks=64, max_num_seqs=8),
        tokenizer=PieceTokenizer(PIECES, EOS),
        registry=registry,
    )
    before = low_margin_count(engine)
    engine.add_request("call", [40, 41], GREEDY, extras={"stream_parser": make_stream_parser(tool_parser="hermes")})
    while engine.has_unfinished():
        engine.step()
    snap = engine.snapshots.latest
    assert snap.extras["b1_count"] == before + EXPECTED == low_margin_count(engine)

    from metrale_core.tui.stats_pane import RateTracker, stats_texts

    assert f"B1 count: {before + EXPECTED}" in stats_texts(snap, RateTracker())["plugins"].plain

    off = LLMEngine(
        model,
        EngineConfig(block_size=4, num_kv_blocks=64, plugin_options={"b1_observer": "off"}),
        tokenizer=PieceTokenizer(PIECES, EOS),
        registry=registry,
    )
    off.add_request("call2", [40, 41], GREEDY)
    off.step()
    assert "b1_count" not in off.snapshots.latest.extras
