"""Calibration through the engine: the window spans requests, freezes, and requantizes what it held."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fp8_testutil import load_checkpoint, write_checkpoint

from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.sampling.params import SamplingParams
from metrale_fp8.e4m3 import FP8_DTYPE, quantize, scale_from_amax

PROMPT_A = [5, 9, 11, 3, 7]  # 5 prefill rows, then 2 decode rows (max_tokens=3)
PROMPT_B = [20, 21, 22, 23, 24, 25]  # 6 prefill rows
GREEDY = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("calib") / "ckpt")


def engine_for(checkpoint, kv_cache_dtype=None, **plugin_options):
    model, registry = load_checkpoint(checkpoint)
    config = EngineConfig(block_size=4, num_kv_blocks=32, kv_cache_dtype=kv_cache_dtype, plugin_options=plugin_options)
    return LLMEngine(model, config, registry=registry)


def run(engine, request_id, prompt):
    engine.add_request(request_id, prompt, GREEDY)
    tokens = []
    while engine.has_unfinished():
        for out in engine.step():
            tokens += out.new_token_ids
    return tokens


def run_overlapped(engines):
    """A's prefill, then B's prefill beside A's first decode row (12 rows observed: the freezing
    step for a 10-token window), then both to completion.  Returns the slots of those 12 rows."""
    for engine in engines:
        engine.add_request("a", PROMPT_A, GREEDY)
        engine.step()
        engine.add_request("b", PROMPT_B, GREEDY)
        engine.step()
    early = written_slots(engines[0])
    for engine in engines:
        while engine.has_unfinished():
            engine.step()
    return early


def written_slots(ref_engine, n_blocks=32, block_size=4):
    """Slots the reference run wrote (non-zero K rows in layer 0)."""
    k = ref_engine.runner.kv.k[0].reshape(n_blocks * block_size, -1)
    return torch.nonzero(k.abs().sum(-1) > 0).flatten()


def test_window_spans_two_requests_and_freezes(checkpoint, log_lines):
    engine = engine_for(checkpoint, "fp8", fp8_kv_calibration_tokens=10)
    codec = engine.runner.kv.codec
    run(engine, "a", PROMPT_A)
    assert codec.num_open_windows == 2
    assert [c.observed for c in codec.calibrations] == [7, 7]
    run(engine, "b", PROMPT_B)
    assert codec.num_open_windows == 0
    assert codec.frozen_after == [13, 13]
    frozen = [m for lvl, m in log_lines if m.startswith("FP8 KV scales frozen after")]
    assert len(frozen) == 2
    assert frozen[0].startswith("FP8 KV scales frozen after 13 tokens (requested 10) on layer 0")


def test_one_token_window_freezes_at_first_observation(checkpoint):
    engine = engine_for(checkpoint, "fp8", fp8_kv_calibration_tokens=1)
    engine.add_request("a", PROMPT_A, GREEDY)
    engine.step()  # the prefill: one observation of 5 rows
    assert engine.runner.kv.codec.frozen_after == [5, 5]


def test_pre_freeze_rows_read_back_exactly(checkpoint):
    """While the window is open, gather returns the rows exactly as written (model precision)."""
    ref = engine_for(checkpoint)
    fp8 = engine_for(checkpoint, "fp8", fp8_kv_calibration_tokens=100)
    assert run(ref, "a", PROMPT_A) == run(fp8, "a", PROMPT_A)
    blocks = torch.arange(32)
    for layer in range(2):
        k_ref, v_ref = ref.runner.kv.gather(layer, blocks, torch.float32)
        k, v = fp8.runner.kv.gather(layer, blocks, torch.float32)
        assert torch.equal(k, k_ref) and torch.equal(v, v_ref)


def test_read_scale_equals_write_scale(checkpoint):
    """After the freeze every held row is stored as quantize(row, frozen scale) and read back as
    code * frozen scale; the frozen scale is amax * headroom / 448 of what was cached."""
    ref = engine_for(checkpoint)
    fp8 = engine_for(checkpoint, "fp8", fp8_kv_calibration_tokens=10, fp8_kv_headroom=1.5)
    early = run_overlapped([ref, fp8])
    codec, kv, ref_kv = fp8.runner.kv.codec, fp8.runner.kv, ref.runner.kv
    assert early.numel() == 12 and codec.frozen_after == [12, 12]
    slots = written_slots(ref)
    assert slots.numel() == 7 + 8  # A: 5 + 2 decode rows, B: 6 + 2 (the last 3 after the freeze)
    # layer 0's K/V depend only on the embeddings: identical in both runs, so bit-exact checks
    k_rows = ref_kv.k[0].reshape(-1, 2, 8)[slots]
    v_rows = ref_kv.v[0].reshape(-1, 2, 8)[slots]
    k_amax = float(ref_kv.k[0].reshape(-1, 2, 8)[early].abs().max())  # what the window observed
    v_amax = float(ref_kv.v[0].reshape(-1, 2, 8)[early].abs().max())
    assert torch.equal(codec.k_scales[0], torch.full((2,), scale_from_amax(k_amax, 1.5)))
    assert torch.equal(codec.v_scales[0], torch.full((2,), scale_from_amax(v_amax, 1.5)))
    codes = kv.k[0].reshape(-1, 2, 8)[slots]
    assert codes.dtype == FP8_DTYPE
    assert torch.equal(codes.view(torch.uint8), quantize(k_rows, codec.k_scales[0]).view(torch.uint8))
    v_codes = kv.v[0].reshape(-1, 2, 8)[slots]
    assert torch.equal(v_codes.view(torch.uint8), quantize(v_rows, codec.v_scales[0]).view(torch.uint8))
    k_read, _ = kv.gather(0, torch.arange(32), torch.float32)
    assert torch.equal(k_read[slots], codes.float() * codec.k_scales[0].view(-1, 1))


def attention(q, k, v):
    """Plain softmax attention of ``q`` ``[n, H, d]`` over ``k``/``v`` ``[L, H, d]``."""
    return F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)).transpose(0, 1)


def test_pre_freeze_attention_within_tolerance_of_bf16_cache(checkpoint):
    bf16 = engine_for(checkpoint, "bf16")
    fp8 = engine_for(checkpoint, "fp8", fp8_kv_calibration_tokens=10)
    slots = run_overlapped([bf16, fp8])  # the 12 rows cached before (or at) the freeze
    assert fp8.runner.kv.codec.frozen_after == [12, 12]
    gen = torch.Generator().manual_seed(0)
    for layer in range(2):
        everything = torch.arange(32)
        k_ref, v_ref = (t.reshape(-1, 2, 8)[slots] for t in bf16.runner.kv.gather(layer, everything, torch.float32))
        k8, v8 = (t.reshape(-1, 2, 8)[slots] for t in fp8.runner.kv.gather(layer, everything, torch.float32))
        q = torch.randn((4, 2, 8), generator=gen) * k_ref.std()
        out_ref, out8 = attention(q, k_ref, v_ref), attention(q, k8, v8)
        rel = float((out8 - out_ref).norm() / out_ref.norm())
        assert rel < 0.08, (layer, rel)
        assert not torch.equal(k8, k_ref)  # it really went through E4M3


def test_paused_writes_are_held_but_not_counted(checkpoint):
    engine = engine_for(checkpoint, "fp8", fp8_kv_calibration_tokens=4)
    codec = engine.runner.kv.codec
    with codec.paused():
        engine.add_request("warmup", PROMPT_A, SamplingParams(max_tokens=1, ignore_eos=True))
        engine.step()
    assert [c.observed for c in codec.calibrations] == [0, 0] and codec.num_open_windows == 2
    run(engine, "real", PROMPT_B)
    assert codec.frozen_after == [6, 6]


def test_calibrated_logits_stay_close_to_bf16(checkpoint):
    bf16 = engine_for(checkpoint, "bf16")
    fp8 = engine_for(checkpoint, "fp8", fp8_kv_calibration_tokens=4)
    assert run(bf16, "a", PROMPT_A + PROMPT_B) == run(fp8, "a", PROMPT_A + PROMPT_B)
