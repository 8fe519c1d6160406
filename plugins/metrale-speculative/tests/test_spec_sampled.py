"""Sampled speculation follows the target distribution (chi-square over many seeds).

The target and the drafter are Markov "table" models (next-token logits depend only on the
current token), so the exact distribution of every output position is computable.  With
temperature 0.8 and top-k 4, the processed distributions differ from the raw logits, so a
verifier that compared the wrong distributions would fail the test.
"""

from __future__ import annotations

import itertools

import torch

from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.engine.speculation import Draft
from metrale_core.model_api import ForwardBatch, KVLayout, ModelInfo
from metrale_core.sampling.params import SamplingParams
from metrale_core.sampling.sampler import truncate
from metrale_speculative.draft_model import DraftModelProposer
from metrale_speculative.gate import SpecGate
from metrale_speculative.speculator import GatedSpeculator

V = 5
N = 1000
PARAMS = dict(temperature=0.8, top_k=4, max_tokens=4, ignore_eos=True)


class TableModel:
    """``logits(next | current) = table[current]``; keeps no state, ignores the KV cache."""

    def __init__(self, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.table = 1.5 * torch.randn(V, V, generator=gen)
        self.info = ModelInfo(
            architecture="table", vocab_size=V, max_position=64, kv=KVLayout(num_layers=1, num_kv_heads=1, head_dim=1)
        )

    def make_state_pool(self, num_slots: int):
        return None

    def forward(self, batch: ForwardBatch, kv, state=None) -> torch.Tensor:
        return self.table[batch.input_ids[batch.logits_rows]].clone()


class FixedProposer:
    """Always drafts ``[1, 2]`` with no probabilities (the n-gram case: one-hot q)."""

    wants_hidden = False

    def propose(self, seqs, max_drafts):
        return [Draft([1, 2][:k]) if k else None for k in max_drafts]

    def observe(self, report) -> None:
        return None


class _Row:
    params = SamplingParams(**PARAMS)


def _transition(model: TableModel) -> torch.Tensor:
    """Processed next-token probabilities ``[V, V]`` (temperature, top-k) of a table model."""
    return torch.softmax(truncate(model.table, [_Row()] * V), dim=-1)


def _chi2_pvalue(observed: torch.Tensor, expected: torch.Tensor) -> float:
    keep = expected > 0
    assert int(observed[~keep].sum()) == 0, "a token of probability 0 was sampled"
    stat = float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), torch.tensor(stat / 2.0)))


def _sample(target: TableModel, speculator) -> tuple[torch.Tensor, dict]:
    engine = LLMEngine(
        target, EngineConfig(block_size=4, num_kv_blocks=8 * 256, max_num_seqs=256), speculator=speculator
    )
    for i in range(N):
        engine.add_request(f"r{i}", [0], SamplingParams(seed=1000 + i, **PARAMS))
    outputs: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
    counts = torch.zeros([V] * 4)
    for tokens in outputs.values():
        assert len(tokens) == 4
        counts[tuple(tokens)] += 1
    return counts, engine.spec_driver.speculator.stats


def _check(counts: torch.Tensor, target: TableModel) -> None:
    p = _transition(target)
    exp = torch.zeros([V] * 4)
    for a, b, c, d in itertools.product(range(V), repeat=4):
        exp[a, b, c, d] = p[0, a] * p[a, b] * p[b, c] * p[c, d]
    exp *= float(counts.sum())
    # (t2, t3): the first verify chunk's tokens; t4: the next chunk's
    assert _chi2_pvalue(counts.sum(dim=(0, 3)).flatten(), exp.sum(dim=(0, 3)).flatten()) > 1e-3
    assert _chi2_pvalue(counts.sum(dim=(0, 1, 2)), exp.sum(dim=(0, 1, 2))) > 1e-3


def test_spec_sampled_draft_model_matches_target():
    target, drafter = TableModel(seed=0), TableModel(seed=7)
    counts, stats = _sample(
        target,
        lambda ctx: GatedSpeculator(
            DraftModelProposer(drafter, target.info, ctx.pipeline, num_blocks=4 * 256, block_size=4),
            2,
            gate=SpecGate(force=True),
        ),
    )
    assert stats.num_verifies > 0 and 0 < stats.drafts_accepted < stats.drafts_proposed
    _check(counts, target)


def test_spec_sampled_one_hot_drafts_match_target():
    target = TableModel(seed=0)
    counts, stats = _sample(target, GatedSpeculator(FixedProposer(), 2, gate=SpecGate(force=True)))
    assert 0 < stats.drafts_accepted < stats.drafts_proposed
    _check(counts, target)


def test_spec_sampled_wrong_rule_is_detected():
    """The test has power: accepting every draft (no rejection) is caught."""
    from metrale_core.engine import speculation

    original = speculation.accept

    def accept_all(processed, draft, probs, *, greedy, generator):
        return speculation.Verdict(len(draft), tuple(draft) + (int(processed[-1].argmax()),))

    import metrale_core.engine.verifier as verifier

    verifier.accept = accept_all
    try:
        target = TableModel(seed=0)
        counts, _ = _sample(target, GatedSpeculator(FixedProposer(), 2, gate=SpecGate(force=True)))
    finally:
        verifier.accept = original
    try:
        _check(counts, target)
    except AssertionError:
        return
    raise AssertionError("a verifier that accepts every draft passed the chi-square test")
