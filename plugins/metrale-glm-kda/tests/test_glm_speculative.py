"""Speculative decoding on GLM-5.3 (KDA recurrent state): rollback is exact, greedy is unchanged.

- Direct: after a verify forward of ``[last, d1..d4]`` (batched with a plain decode row) and
  ``commit_verify(num_kept=m)``, every KDA layer's conv window and recurrent state equal
  (``torch.equal``) the state of consuming only the first ``m`` recorded rows; the state also
  matches (to float noise) a plain forward that fed only those ``m`` tokens and differs from one
  that fed ``m + 1``; ``m == k + 1`` leaves the state untouched; the decode row is never touched.
- Engine: greedy output with speculation equals output without it, token for token, on both
  random GLM configs, with the n-gram proposer, a draft-model proposer (a tiny Qwen3 sharing the
  vocabulary) and a scripted proposer whose drafts are the true continuation with one token
  corrupted at a rotating position (partial accepts of every length, and full accepts); the
  batch mixes speculative and plain (opted-out) requests, one request stops on a stop token
  mid-draft, one on a short ``max_tokens``; a squeezed KV pool forces preemptions.
"""

from __future__ import annotations

import glm_harness as H
import pytest
import torch

from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.engine.speculation import Draft
from metrale_core.model_api import ForwardBatch, PagedKVCache
from metrale_core.plugin.components import LoadOptions
from metrale_core.plugin.discovery import load_registry
from metrale_core.sampling.params import SamplingParams
from metrale_core.testing.random_checkpoint import write_random_checkpoint
from metrale_core.weights import open_weights
from metrale_glm_kda import kda
from metrale_speculative.draft_model import DraftModelProposer
from metrale_speculative.factories import load_checkpoint_model
from metrale_speculative.gate import SpecGate
from metrale_speculative.ngram import NgramProposer
from metrale_speculative.speculator import GatedSpeculator

BS = 4


def _load(path):
    store = open_weights(path)
    return load_registry().find_model_loader(store.config).factory(store, LoadOptions())


@pytest.fixture(scope="module", params=sorted(H.CONFIGS))
def glm(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"spec_{request.param}")
    H.save_checkpoint(request.param, path, seed=7 + len(request.param))
    return request.param, _load(path)


# --- direct rollback test --------------------------------------------------------------------
def _batch(model, chunks, verify=()) -> ForwardBatch:
    """``chunks``: (token ids, start position, state slot, block ids) per sequence."""
    ids, pos, slots, qs, ctx, tables = [], [], [], [0], [], []
    logits = []
    for toks, start, _, blocks in chunks:
        ids += toks
        pos += range(start, start + len(toks))
        slots += [blocks[p // BS] * BS + p % BS for p in range(start, start + len(toks))]
        qs.append(qs[-1] + len(toks))
        ctx.append(start + len(toks))
        logits += range(qs[-2], qs[-1])
        tables.append(blocks)
    t = torch.tensor
    return ForwardBatch(
        input_ids=t(ids),
        positions=t(pos),
        query_start=t(qs),
        context_lens=t(ctx),
        block_tables=t(tables),
        slot_mapping=t(slots),
        logits_rows=t(logits),
        state_slots=t([c[2] for c in chunks]),
        state_fresh=t([c[1] == 0 for c in chunks]),
        query_lens_host=tuple(len(c[0]) for c in chunks),
        context_lens_host=tuple(ctx),
        block_size=BS,
        verify_host=tuple(verify),
    )


def _state(pool, slot):
    return [(r[slot].clone(), c[slot].clone()) for r, c in zip(pool.recurrent, pool.conv)]


def test_commit_verify_leaves_exactly_the_kept_rows(glm):
    _, model = glm
    g = torch.Generator().manual_seed(3)
    prompt_a, prompt_b = (torch.randint(3, H.VOCAB, (n,), generator=g).tolist() for n in (11, 6))
    verify_rows = torch.randint(3, H.VOCAB, (5,), generator=g).tolist()  # [last, d1..d4]
    blocks_a, blocks_b = [0, 1, 2, 3, 4], [5, 6, 7, 8, 9]
    for keep in (1, 2, 3, 5):
        kv = PagedKVCache.allocate(model.info.kv, 16, BS)
        pool = model.make_state_pool(4)
        model.forward(_batch(model, [(prompt_a, 0, 0, blocks_a), (prompt_b, 0, 1, blocks_b)]), kv, pool)
        before = _state(pool, 0)
        model.forward(
            _batch(model, [(verify_rows, 11, 0, blocks_a), ([9], 6, 1, blocks_b)], verify=(True, False)), kv, pool
        )
        log = pool.verify
        assert log is not None and log.rows == {0: 5}
        b_after_forward = _state(pool, 1)
        model.commit_verify(pool, [0], [keep])
        assert pool.verify is None
        got = _state(pool, 0)
        assert all(torch.equal(x, y) for pair in zip(_state(pool, 1), b_after_forward) for x, y in zip(*pair))
        for j, ((rec, conv), (rec0, conv0)) in enumerate(zip(got, before)):
            r = log.records[0][j]
            assert torch.equal(r.rec, rec0) and torch.equal(r.conv, conv0)
            window = torch.cat([conv0, r.raw[:keep].t().to(conv0.dtype)], dim=-1)[:, -conv0.shape[-1] :]
            _, want = kda.kda_recurrent(r.q[:keep], r.k[:keep], r.v[:keep], r.g[:keep], r.beta[:keep], rec0[None])
            assert torch.equal(conv, window), f"layer {j} keep {keep}: conv window"
            assert torch.equal(rec, want[0]), f"layer {j} keep {keep}: recurrent state"
            if keep < 5:
                _, fed_more = kda.kda_recurrent(
                    r.q[: keep + 1], r.k[: keep + 1], r.v[: keep + 1], r.g[: keep + 1], r.beta[: keep + 1], rec0[None]
                )
                assert not torch.equal(rec, fed_more[0])
        # model level: the same as a forward that fed only the kept tokens (to float noise), and
        # not the state after one row more
        for fed in (keep, keep + 1):
            if fed > len(verify_rows):
                continue
            ref_pool = model.make_state_pool(1)
            for r, c, (rec0, conv0) in zip(ref_pool.recurrent, ref_pool.conv, before):
                r[0], c[0] = rec0, conv0
            ref_kv = PagedKVCache(k=[t.clone() for t in kv.k], v=[t.clone() for t in kv.v], block_size=BS)
            model.forward(_batch(model, [(verify_rows[:fed], 11, 0, blocks_a)]), ref_kv, ref_pool)
            worst = max(
                max((a - b).abs().max().item(), (c - d).float().abs().max().item())
                for (a, c), (b, d) in zip(got, _state(ref_pool, 0))
            )
            if fed == keep:
                assert worst < 1e-5, f"keep {keep}: state differs from feeding the kept tokens by {worst}"
            else:
                assert worst > 1e-4, f"keep {keep}: the state looks like one more row was fed"


def test_commit_verify_refuses_slots_that_fed_no_verify_chunk(glm):
    _, model = glm
    kv = PagedKVCache.allocate(model.info.kv, 8, BS)
    pool = model.make_state_pool(2)
    model.forward(_batch(model, [([5, 6, 7], 0, 0, [0, 1])]), kv, pool)
    with pytest.raises(RuntimeError, match="no verify chunk"):
        model.commit_verify(pool, [0], [1])


# --- engine greedy equivalence -------------------------------------------------------------
class CharTokenizer:
    """One letter per id (stop strings work on random models)."""

    eos_token_ids: tuple[int, ...] = ()

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + int(t) % 26) for t in ids)


class ScriptedProposer:
    """Drafts the known greedy continuation with one token corrupted at a rotating index, so the
    verify keeps 1, 2, ... k+1 rows in turn."""

    wants_hidden = False

    def __init__(self, truth: dict[str, list[int]]) -> None:
        self.truth = truth
        self.calls = 0

    def propose(self, seqs, max_drafts):
        drafts = []
        for seq, cap in zip(seqs, max_drafts):
            done = len(seq.output_ids)
            want = list(self.truth.get(seq.request_id, [])[done : done + cap])
            self.calls += 1
            bad = self.calls % (cap + 1)
            if bad < len(want):
                want[bad] = (want[bad] + 1) % H.VOCAB
            drafts.append(Draft(want) if want else None)
        return drafts

    def observe(self, report) -> None:
        pass


def _requests():
    g = torch.Generator().manual_seed(11)
    rand = torch.randint(3, H.VOCAB, (9,), generator=g).tolist()
    greedy = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    return [
        ("rep", [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], greedy),
        ("rand", rand, greedy),
        ("short", [3, 1, 4, 1, 5, 9, 2, 6], SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True)),
        ("stoptok", [11, 12, 13, 11, 12, 13, 11], greedy),
        ("plain", [30, 31, 32, 30, 31, 32], greedy),
    ]


def _run(model, requests, *, speculator=None, plain_ids=(), **config):
    settings = dict(block_size=BS, num_kv_blocks=128, max_num_seqs=8, max_prefill_tokens=32)
    settings.update(config)
    engine = LLMEngine(model, EngineConfig(**settings), tokenizer=CharTokenizer(), speculator=speculator)
    for rid, prompt, params in requests:
        engine.add_request(rid, prompt, params, extras={"speculative": False} if rid in plain_ids else None)
    out = {rid: ([], None) for rid, _, _ in requests}
    for _ in range(400):
        if not engine.has_unfinished():
            break
        for o in engine.step():
            out[o.request_id][0].extend(o.new_token_ids)
            if o.finished:
                out[o.request_id] = (out[o.request_id][0], o.finish_reason)
    assert not engine.has_unfinished()
    return out, engine


@pytest.fixture(scope="module")
def baseline(glm):
    _name, model = glm
    base, _ = _run(model, _requests())
    stop = base["stoptok"][0][6]  # a token it really emits: it stops early (mid-draft)
    requests = [
        (
            rid,
            p,
            SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, stop_token_ids=(stop,))
            if rid == "stoptok"
            else params,
        )
        for rid, p, params in _requests()
    ]
    expected, _ = _run(model, requests)
    assert expected["stoptok"][1] == "stop" and len(expected["stoptok"][0]) < 20
    assert expected["short"] == (base["short"][0], "length") and len(base["short"][0]) == 7
    return requests, expected, base


@pytest.fixture(scope="module")
def qwen_drafter(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen_drafter")
    shapes = dict(vocab_size=H.VOCAB, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    no_specials = dict(tie_word_embeddings=False, eos_token_id=None, bos_token_id=None)
    write_random_checkpoint(path, tokenizer=False, seed=5, **shapes, **no_specials)
    return load_checkpoint_model(path)


def _speculator(kind, truth, drafter):
    gate = SpecGate(force=True)
    if kind == "ngram":
        return lambda ctx: GatedSpeculator(NgramProposer(1, 3), 4, gate=gate)
    if kind == "draft":
        return lambda ctx: GatedSpeculator(
            DraftModelProposer(drafter, ctx.model.info, ctx.pipeline, num_blocks=128, block_size=BS), 3, gate=gate
        )
    return lambda ctx: GatedSpeculator(ScriptedProposer(truth), 4, gate=gate)


@pytest.mark.parametrize("kind,kv_blocks", [("ngram", 128), ("draft", 128), ("scripted", 128), ("scripted", 16)])
def test_greedy_output_unchanged_by_speculation(glm, baseline, qwen_drafter, kind, kv_blocks):
    name, model = glm
    requests, expected, base = baseline
    truth = {rid: toks for rid, (toks, _) in base.items()}
    got, engine = _run(
        model,
        requests,
        speculator=_speculator(kind, truth, qwen_drafter),
        plain_ids=("plain",),
        num_kv_blocks=kv_blocks,
    )
    assert got == expected, f"{name}/{kind}: speculation changed greedy output"
    stats = engine.spec_driver.speculator.stats
    assert stats.num_verifies > 0
    if kind == "scripted":
        assert 0 < stats.drafts_accepted < stats.drafts_proposed  # partial and full accepts
    if kv_blocks < 128:
        assert engine.stats().num_preemptions >= 1, "the squeezed pool should force a preemption"
