"""metrale-dry: installed, enabled by ``--dry-multiplier``, and it breaks a verbatim loop.

The end-to-end test runs the real engine over a tiny "loop model" (a bigram table that always
prefers to continue a cycle) built from parsed CLI flags: greedy decoding repeats the cycle
without DRY, and leaves it once the repeat grows long enough with DRY.
"""

from __future__ import annotations

import pytest
import torch

from metrale_core.cli.flags import engine_config_from_args
from metrale_core.cli.main import build_parser
from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.errors import ConfigError
from metrale_core.model_api import ModelInfo
from metrale_core.plugin.components import LogitProcessorSpec
from metrale_core.sampling import DefaultSampler, LogitPipeline, PositionKind, SamplingParams
from metrale_core.testing.plugin_listing import met_plugins_listing
from metrale_dry.penalty import MAX_MATCH, DryPenalty, DrySettings, build, match_lengths

VOCAB = 16
CYCLE = (3, 4, 5, 6)  # the loop model continues this cycle...
ESCAPE = 9  # ...and its second choice is always this token


class LoopModel:
    """A bigram model: after any token it puts 10 on the cycle's next token and 8 on ESCAPE."""

    info = ModelInfo(architecture="loop", vocab_size=VOCAB, max_position=256, kv=None, eos_token_ids=(0,))

    def forward(self, batch, kv, state=None):
        last = batch.input_ids[batch.logits_rows].tolist()
        logits = torch.zeros(len(last), VOCAB)
        for i, token in enumerate(last):
            nxt = CYCLE[(CYCLE.index(token) + 1) % len(CYCLE)] if token in CYCLE else CYCLE[0]
            logits[i, nxt], logits[i, ESCAPE] = 10.0, 8.0
        return logits

    def make_state_pool(self, num_slots):
        return None


class Row:
    def __init__(self, prompt, output=()):
        self.params = SamplingParams(temperature=0.0)
        self.prompt_ids, self.output_ids = tuple(prompt), list(output)
        self.generator, self.extras = None, {}


@pytest.fixture(scope="module")
def registry():
    from metrale_core.plugin.discovery import load_registry

    return load_registry()


def engine_from_flags(registry, *flags):
    args = build_parser(registry).parse_args(["generate", "x", "--kv-cache-memory", "64K", *flags])
    return LLMEngine(LoopModel(), engine_config_from_args(args), registry=registry)


def generate(engine, prompt, n):
    engine.add_request("r", list(prompt), SamplingParams(temperature=0.0, max_tokens=n))
    tokens = []
    while engine.has_unfinished():
        for out in engine.step():
            tokens.extend(out.new_token_ids)
    return tokens


def test_plugin_is_installed(registry):
    spec = registry.logit_processors["dry"]
    assert registry.provider("logit_processors", "dry").distribution == "metrale-dry"
    assert spec.kinds == {PositionKind.PREFILL_LAST, PositionKind.FINAL_DECODE}
    listing = met_plugins_listing()
    assert "metrale-dry" in listing and "logit_processors: dry" in listing


def test_off_by_default_and_enabled_by_flag(registry):
    off = engine_from_flags(registry)
    assert "dry" not in off.output_processor.pipeline.processor_names
    on = engine_from_flags(registry, "--dry-multiplier", "0.8", "--dry-allowed-length", "3", "--dry-breaker-ids", "7,8")
    assert "dry" in on.output_processor.pipeline.processor_names
    assert on.config.plugin_options["dry_breaker_ids"] == (7, 8)


def test_flag_rejects_bad_breaker_ids(registry, capsys):
    with pytest.raises(SystemExit):
        build_parser(registry).parse_args(["generate", "x", "--dry-breaker-ids", "7,newline"])
    assert "--dry-breaker-ids" in capsys.readouterr().err


def test_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match="--dry-base"):
        build(EngineConfig(plugin_options={"dry_multiplier": 1.0, "dry_base": 0.5}))
    assert build(EngineConfig()) is None


def test_engine_breaks_the_loop_only_with_dry(registry):
    prompt = [3, 4, 5, 6]
    plain = generate(engine_from_flags(registry), prompt, 12)
    assert plain == [3, 4, 5, 6] * 3 and ESCAPE not in plain
    dry = generate(engine_from_flags(registry, "--dry-multiplier", "1", "--dry-base", "2"), prompt, 12)
    # after "3 4 5 6 3 4 5 6" the continuation 3 would extend a 4-token repeat: it loses
    # 1 * 2**(4-2) = 4 > the margin of 2, so ESCAPE wins (after "...3 4 5" the penalty on 6 is
    # 2, a tie, and the lower id wins)
    assert dry[:5] == [3, 4, 5, 6, ESCAPE], dry
    assert dry != plain


def test_match_lengths_follow_the_definition():
    # context "a b c d a b c": continuing with d repeats "a b c d" -> the suffix "a b c" matched
    assert match_lengths([1, 2, 3, 4, 1, 2, 3]) == {4: 3}
    # a breaker inside the suffix ends the match there
    assert match_lengths([1, 2, 3, 4, 1, 2, 3], frozenset({1})) == {4: 2}
    # the last token a breaker: nothing is penalised; a breaker successor is never penalised
    assert match_lengths([1, 2, 3, 1, 2], frozenset({2})) == {}
    assert match_lengths([1, 2, 3, 1], frozenset({2})) == {}
    # several earlier occurrences: each successor gets its own longest match
    assert match_lengths([7, 1, 5, 8, 1, 6, 7, 1]) == {5: 2, 6: 1}
    # long runs are capped
    assert match_lengths([5] * 200) == {5: MAX_MATCH}


def test_penalty_hits_only_repeat_continuations():
    settings = DrySettings(multiplier=0.5, base=2.0, allowed_length=2)
    pipeline = LogitPipeline([(LogitProcessorSpec("dry", factory=build), DryPenalty(settings))], DefaultSampler())
    rows = [Row([1, 2, 3, 4, 1, 2], [3]), Row([1, 2, 3, 4])]
    logits = torch.zeros(2, VOCAB)
    out = pipeline.adjusted_logits(logits, rows, [PositionKind.FINAL_DECODE] * 2)
    expected = torch.zeros(2, VOCAB)
    expected[0, 4] = -0.5 * 2.0 ** (3 - 2)  # "1 2 3" + 4 repeats a 4-token run
    assert torch.equal(out, expected)  # row 1 has no repeat: untouched
    assert torch.equal(logits, torch.zeros(2, VOCAB))  # the caller's logits are not modified


def test_penalty_last_n_limits_the_lookback():
    settings = DrySettings(multiplier=1.0, penalty_last_n=4)
    logits = torch.zeros(1, VOCAB)
    penalty = DryPenalty(settings)
    # the earlier "1 2 3 4" lies outside the last 4 tokens
    from metrale_core.sampling import ProcessorContext

    penalty(logits, ProcessorContext([0], [Row([1, 2, 3, 4, 9, 1, 2, 3])], [PositionKind.FINAL_DECODE]))
    assert torch.equal(logits, torch.zeros(1, VOCAB))
    DryPenalty(DrySettings(multiplier=1.0))(
        logits, ProcessorContext([0], [Row([1, 2, 3, 4, 9, 1, 2, 3])], [PositionKind.FINAL_DECODE])
    )
    assert logits[0, 4] == -1.0 * 1.75 ** (3 - 2)
