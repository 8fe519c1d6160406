"""Greedy equivalence: speculation never changes greedy output, token for token."""

from __future__ import annotations

import pytest
import torch
from spec_harness import CharTokenizer, load, run, streams, write_perturbed, write_qwen3

from metrale_core.sampling.params import SamplingParams
from metrale_speculative.draft_model import DraftModelProposer
from metrale_speculative.gate import SpecGate
from metrale_speculative.ngram import NgramProposer
from metrale_speculative.speculator import GatedSpeculator

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return write_qwen3(tmp_path_factory.mktemp("target"), seed=1)


@pytest.fixture(scope="module")
def mtp_dir(tmp_path_factory):
    return write_qwen3(tmp_path_factory.mktemp("mtp"), seed=3, mtp=True)


@pytest.fixture(scope="module")
def target(target_dir):
    return load(target_dir)


@pytest.fixture(scope="module")
def other_draft(target_dir, tmp_path_factory):
    return load(write_perturbed(target_dir, tmp_path_factory.mktemp("draft"), seed=2, scale=0.3))


def _requests():
    rep = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]
    greedy = SamplingParams(temperature=0.0, max_tokens=24)
    return [
        ("rep", rep, greedy),
        ("short", [3, 1, 4, 1, 5], SamplingParams(temperature=0.0, max_tokens=13)),
        ("stoptok", [11, 12, 13, 11, 12, 13, 11], greedy),
        ("stopstr", [20, 21, 22, 20, 21, 22, 20, 21], greedy),
        ("plain", [30, 31, 32, 30, 31, 32], greedy),
    ]


def _with_stops(baseline):
    """Stop rules that end sequences mid-stream: a stop token and a stop string taken from the
    baseline's own output (so they really occur)."""
    reqs = _requests()
    toks = baseline["stoptok"][0]
    text = baseline["stopstr"][2]
    out = []
    for rid, prompt, params in reqs:
        if rid == "stoptok":
            params = SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=(toks[9],))
        if rid == "stopstr":
            params = SamplingParams(temperature=0.0, max_tokens=24, stop=(text[7:9],))
        out.append((rid, prompt, params))
    return out


def _speculator(name, target, other_draft, mtp_dir=None):
    """A factory ``f(ProposerContext)`` (the engine hands it its pipeline)."""
    gate = SpecGate(force=True)
    if name == "mtp":
        from metrale_speculative.mtp import MtpProposer

        return lambda ctx: GatedSpeculator(
            MtpProposer.from_checkpoint(
                mtp_dir, ctx.model, ctx.pipeline, max_model_len=ctx.max_model_len, block_size=4
            ),
            3,
            gate=gate,
        )
    if name == "ngram":
        return lambda ctx: GatedSpeculator(NgramProposer(1, 3), 4, gate=gate)
    draft = target if name == "draft_self" else other_draft
    k = 3 if name == "draft_self" else 2
    return lambda ctx: GatedSpeculator(
        DraftModelProposer(draft, ctx.model.info, ctx.pipeline, num_blocks=256, block_size=4), k, gate=gate
    )


@pytest.mark.parametrize("name", ["ngram", "draft_self", "draft_other", "mtp"])
def test_spec_greedy_equivalence_qwen3(target, other_draft, mtp_dir, name):
    if name == "mtp":  # the MTP checkpoint's own trunk is the target
        target = load(mtp_dir)
    tok = CharTokenizer()
    plain = run(target, _requests(), tokenizer=tok)
    base = streams(plain)
    requests = _with_stops(base)
    expected = streams(run(target, requests, tokenizer=tok))
    assert expected["stoptok"][1] == "stop" and len(expected["stoptok"][0]) < 24
    assert expected["stopstr"][1] == "stop" and len(expected["stopstr"][0]) < 24
    got_run = run(
        target,
        requests,
        tokenizer=tok,
        plain_ids=("plain",),
        speculator=_speculator(name, target, other_draft, mtp_dir),
    )
    assert streams(got_run) == expected
    stats = got_run["_engine"].spec_driver.speculator.stats
    assert stats.num_verifies > 0 and stats.drafts_accepted > 0
    if name != "draft_self":
        assert stats.drafts_accepted < stats.drafts_proposed  # partial accepts happened
    else:
        assert stats.drafts_accepted == stats.drafts_proposed  # own draft: all accepted
    # fewer engine steps than tokens: several tokens per verify
    assert got_run["rep"]["steps"] < len(expected["rep"][0])
