"""The ``speculative`` snapshot extra: attached by ``metrale_engine_started`` when the engine has a
speculator (``--speculative``), absent otherwise, and rendered on the dashboard's stats tab."""

from __future__ import annotations

import pytest
import torch
from spec_harness import load, write_qwen3

from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.plugin.discovery import load_registry
from metrale_core.sampling.params import SamplingParams
from metrale_speculative.spec_stats import SpecStats

torch.set_num_threads(2)

REPEATING = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return load(write_qwen3(tmp_path_factory.mktemp("target"), seed=1))


def run_engine(model, **plugin_options) -> LLMEngine:
    config = EngineConfig(block_size=4, num_kv_blocks=64, max_num_seqs=2, plugin_options=plugin_options)
    engine = LLMEngine(model, config, registry=load_registry())
    engine.add_request("r", REPEATING, SamplingParams(temperature=0.0, max_tokens=16))
    while engine.has_unfinished():
        engine.step()
    return engine


def test_acceptance_is_published_when_speculation_is_on(target):
    engine = run_engine(target, speculative="ngram", num_draft_tokens=3, spec_gate="force", ngram_min=1)
    stats = engine.spec_driver.speculator.stats
    extra = engine.snapshots.latest.extras["speculative"]
    assert extra["num_verifies"] > 0 and extra["drafts_proposed"] > 0  # this engine verified drafts
    assert extra["acceptance_rate"] == pytest.approx(stats.drafts_accepted / stats.drafts_proposed)
    assert extra["acceptance_length"] == pytest.approx(stats.tokens_emitted / stats.num_verifies)
    assert extra == stats.summary()  # the live counters, not a copy taken at start-up


def test_two_engines_in_one_process_count_separately(target):
    first = run_engine(target, speculative="ngram", num_draft_tokens=3, spec_gate="force", ngram_min=1)
    alone = first.spec_driver.speculator.stats.snapshot()
    second = run_engine(target, speculative="ngram", num_draft_tokens=3, spec_gate="force", ngram_min=1)
    a, b = first.spec_driver.speculator.stats, second.spec_driver.speculator.stats
    assert isinstance(a, SpecStats) and a is not b
    assert a.snapshot() == alone  # the second engine's verifies did not reach the first's counters
    assert b.snapshot() == alone  # the same requests on a fresh engine: the same counts, from zero
    assert first.snapshots.latest.extras["speculative"] == a.summary()
    assert second.snapshots.latest.extras["speculative"] == b.summary()


def test_no_extra_when_speculation_is_off(target):
    engine = run_engine(target)
    assert engine.spec_driver is None
    assert "speculative" not in engine.snapshots.latest.extras


def test_stats_tab_shows_the_acceptance(target):
    from metrale_core.tui.stats_pane import RateTracker, stats_texts

    engine = run_engine(target, speculative="ngram", num_draft_tokens=3, spec_gate="force", ngram_min=1)
    snap = engine.snapshots.latest
    extra = snap.extras["speculative"]
    text = stats_texts(snap, RateTracker())["plugins"].plain
    assert (
        f"speculative: acceptance {100 * extra['acceptance_rate']:.1f}%, {extra['acceptance_length']:.2f} tok/verify"
    ) in text
