"""Gemma 3 with the engine's features, on the random config whose window (6) is shorter than
every prompt: each weight format of the shared linear layer against ``exact``; prefix caching
(a hit on a prefix longer than the window, same greedy tokens as transformers); speculative
decoding with Gemma as the target (n-gram proposer) and as the draft model of itself, greedy
output unchanged; the FP8 KV cache (metrale-fp8) close to the fp32 cache's logits.
"""

from __future__ import annotations

import gemma3_harness as H
import pytest
import torch

from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.plugin.components import LoadOptions
from metrale_core.plugin.discovery import load_registry
from metrale_core.sampling.params import SamplingParams
from metrale_core.testing.forward_spy import ForwardSpy
from metrale_core.weights import open_weights
from metrale_speculative.draft_model import DraftModelProposer
from metrale_speculative.factories import load_checkpoint_model
from metrale_speculative.gate import SpecGate
from metrale_speculative.ngram import NgramProposer
from metrale_speculative.speculator import GatedSpeculator

NAME = "window6-softcap"
BS = 4
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma3_features")
    hf = H.save_checkpoint(NAME, path, seed=3)
    return path, hf


def _model(path, weight_format="exact"):
    store = open_weights(path)
    return load_registry().find_model_loader(store.config).factory(store, LoadOptions(weight_format=weight_format))


def test_lora_targets_are_attention_and_mlp_of_every_layer_by_path(checkpoint):
    """The model declares q/k/v, o, gate/up and down of every layer for LoRA (not the head), by
    checkpoint module path and by their path from the model; attach_lora wraps exactly those."""
    from metrale_core.layers.lowrank.lora import LoRALinear, attach_lora

    model = _model(checkpoint[0])
    declared = {t.dotted: [p.module.split("layers.")[-1] for p in t.parts] for t in model.lora_targets()}
    want = {}
    for i in range(len(model.weights.layers)):
        a, m = f"{i}.self_attn.", f"{i}.mlp."
        want[f"weights.layers.{i}.qkv"] = [a + "q_proj", a + "k_proj", a + "v_proj"]
        want[f"weights.layers.{i}.o_proj"] = [a + "o_proj"]
        want[f"weights.layers.{i}.gate_up"] = [m + "gate_proj", m + "up_proj"]
        want[f"weights.layers.{i}.down"] = [m + "down_proj"]
    assert declared == want
    attach_lora(model, num_slots=1, max_rank=2, dtype=torch.float32, device="cpu")
    for layer in model.weights.layers:
        assert all(isinstance(p, LoRALinear) for p in (layer.qkv, layer.o_proj, layer.gate_up, layer.down))
    assert not isinstance(model.weights.head, LoRALinear)


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, H.VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _engine(model, **config) -> LLMEngine:
    settings = dict(block_size=BS, num_kv_blocks=256, max_prefill_tokens=16, max_num_seqs=4)
    settings.update(config)
    return LLMEngine(model, EngineConfig(**settings), registry=load_registry())


def _generate(engine, prompts, params=GREEDY, extras=None) -> list[list[int]]:
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}-{len(prompt)}-{id(prompts)}", list(prompt), params, extras=extras)
    out: dict[str, list[int]] = {}
    order: list[str] = []
    while engine.has_unfinished():
        for o in engine.step():
            if o.request_id not in out:
                order.append(o.request_id)
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
    return [out[k] for k in sorted(order, key=lambda k: int(k.split("-")[0][1:]))]


@pytest.mark.parametrize("weight_format,bound", [("bf16", 0.02), ("int8", 0.04), ("int4", 0.06)])
def test_every_weight_format_stays_near_exact(checkpoint, weight_format, bound):
    """Every logits row of a 30-token prefill and 8 decode steps, relative to the largest logit."""
    path, _ = checkpoint
    prompt = _prompt(30, seed=1)
    rows = {}
    for fmt in ("exact", weight_format):
        spy = ForwardSpy(_model(path, fmt))
        _generate(_engine(spy), [prompt], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
        rows[fmt] = dict(spy.rows)
    exact, other = rows["exact"], rows[weight_format]
    shared = sorted(set(exact) & set(other), key=len)
    assert len(shared) >= 8
    worst = max((exact[h] - other[h]).abs().max().item() / exact[h].abs().max().item() for h in shared)
    assert 0 < worst <= bound, f"{weight_format}: worst row differs by {worst:.4f} of its largest logit"


def test_a_prefix_hit_longer_than_the_window_keeps_the_greedy_tokens(checkpoint):
    path, hf = checkpoint
    prefix = _prompt(40, seed=2)
    second = prefix + _prompt(5, seed=3)
    engine = _engine(_model(path), enable_prefix_caching=True)
    first_out = _generate(engine, [prefix])[0]
    second_out = _generate(engine, [second])[0]
    assert engine.scheduler.block_manager.prefix_cache_stats().hits >= 32  # most of the first prompt reused
    assert first_out == H.hf_greedy(hf, prefix, GREEDY.max_tokens)
    assert second_out == H.hf_greedy(hf, second, GREEDY.max_tokens)


@pytest.mark.parametrize("proposer", ["ngram", "gemma-draft"])
def test_speculation_leaves_greedy_output_unchanged(checkpoint, proposer):
    """Gemma as the target (n-gram drafts), and Gemma as the draft model of itself (a windowed
    draft model in its own KV pool: every draft is accepted)."""
    path, _ = checkpoint
    model = _model(path)
    prompts = [_prompt(n, seed=10 + n) for n in (9, 21, 30)] + [[5, 6, 7, 8] * 5]
    expected = _generate(_engine(model), prompts)
    gate = SpecGate(force=True)
    if proposer == "ngram":
        speculator = lambda ctx: GatedSpeculator(NgramProposer(1, 3), 4, gate=gate)
    else:
        drafter = load_checkpoint_model(path)
        speculator = lambda ctx: GatedSpeculator(
            DraftModelProposer(drafter, ctx.model.info, ctx.pipeline, num_blocks=256, block_size=BS), 3, gate=gate
        )
    engine = LLMEngine(
        model,
        EngineConfig(block_size=BS, num_kv_blocks=256, max_prefill_tokens=16, max_num_seqs=4),
        registry=load_registry(),
        speculator=speculator,
    )
    assert _generate(engine, prompts) == expected
    stats = engine.spec_driver.speculator.stats
    assert stats.num_verifies > 0 and stats.drafts_accepted > 0
    if proposer == "gemma-draft":
        assert stats.drafts_accepted == stats.drafts_proposed  # the draft is the target itself


def test_the_fp8_kv_cache_stays_near_the_fp32_cache(checkpoint):
    path, _ = checkpoint
    prompt = _prompt(30, seed=4)
    rows = {}
    for dtype in (None, "fp8"):
        spy = ForwardSpy(_model(path))
        engine = _engine(spy, kv_cache_dtype=dtype)
        _generate(engine, [prompt], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
        rows[dtype] = dict(spy.rows)
    ref, fp8 = rows[None], rows["fp8"]
    shared = sorted(set(ref) & set(fp8), key=len)
    assert len(shared) >= 8
    worst = max((ref[h] - fp8[h]).abs().max().item() / ref[h].abs().max().item() for h in shared)
    assert 0 < worst <= 0.1, f"fp8 KV: worst row differs by {worst:.4f} of its largest logit"
