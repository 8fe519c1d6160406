"""E4M3 storage: saturation (never NaN), round-trip error, the codec seam, unscaled clipping."""

from __future__ import annotations

import pytest
import torch
from fp8_testutil import load_checkpoint, write_checkpoint

from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.errors import ConfigError
from metrale_core.model_api import KVLayout, PagedKVCache
from metrale_core.sampling.params import SamplingParams
from metrale_fp8.codec import Fp8KVCodec
from metrale_fp8.e4m3 import FP8_DTYPE, FP8_MAX, dequantize, quantize


def test_saturation_never_nan():
    x = torch.tensor([1e30, -1e30, float("inf"), float("-inf"), 448.0, 449.0, 500.0, -464.0, 447.0])
    q = quantize(x, torch.tensor(1.0))
    assert q.dtype == FP8_DTYPE
    out = q.float()
    assert not torch.isnan(out).any()
    assert out.tolist() == [448.0, -448.0, 448.0, -448.0, 448.0, 448.0, 448.0, -448.0, 448.0]
    # a tiny scale pushes ordinary values far past the range: still saturated, not NaN
    big = quantize(torch.randn(64, 2, 8) * 10, torch.tensor(1e-6)).float()
    assert not torch.isnan(big).any() and big.abs().max() == FP8_MAX


def test_round_trip_error_is_bounded():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((256, 2, 16), generator=gen) * 3
    scale = torch.tensor([x[:, 0].abs().max() / 448, x[:, 1].abs().max() / 448])  # per head
    back = dequantize(quantize(x, scale), scale, torch.float32)
    # 3 mantissa bits: relative error <= 2^-4 for normals, plus half a subnormal step near zero
    bound = x.abs() * 2.0**-4 + scale.view(-1, 1) * 2.0**-10
    assert ((back - x).abs() <= bound).all()


def test_codec_write_gather_round_trip_and_seam():
    layout = KVLayout(num_layers=2, num_kv_heads=2, head_dim=4, dtype=FP8_DTYPE)
    codec = Fp8KVCodec(2, [torch.tensor(0.5)] * 2, [torch.tensor([0.25, 1.0])] * 2, ["unit"] * 2)
    cache = PagedKVCache.allocate(layout, num_blocks=4, block_size=2, codec=codec)
    assert not cache.plain and cache.k[1].dtype == FP8_DTYPE
    k = torch.tensor([[[1.0, -2.0, 3.0, 1000.0]] * 2, [[0.5, 0.25, -0.125, 0.0]] * 2])
    v = -k
    cache.write(1, torch.tensor([5, 2]), k, v)
    got_k, got_v = cache.gather(1, torch.tensor([[2, 1]]), torch.float32)  # slots 4,5 then 2,3
    assert got_k.shape == (1, 4, 2, 4)
    expected_k0 = torch.tensor([1.0, -2.0, 3.0, 224.0])  # 1000 / 0.5 saturates at 448 -> 224
    assert torch.equal(got_k[0, 1, 0], expected_k0)
    assert torch.equal(got_k[0, 2], k[1])  # exactly representable
    assert torch.equal(got_v[0, 1, 1], torch.tensor([-1.0, 2.0, -3.0, -448.0]))  # head 1: scale 1.0
    assert torch.count_nonzero(cache.k[0].float()) == 0  # layer 0 untouched


def test_fp8_without_the_plugin_names_it(tmp_path):
    model, _ = load_checkpoint(write_checkpoint(tmp_path / "c"))
    with pytest.raises(ConfigError, match="install the metrale-fp8 plugin"):
        LLMEngine(model, EngineConfig(num_kv_blocks=8, kv_cache_dtype="fp8"), registry=None)


def test_unscaled_large_keys_are_clipped_not_nan(tmp_path):
    """A checkpoint whose K runs past 448 at scale 1.0: the logits stay finite."""
    model, registry = load_checkpoint(write_checkpoint(tmp_path / "big", k_gain=2000.0))
    engine = LLMEngine(model, EngineConfig(num_kv_blocks=8, block_size=4, kv_cache_dtype="fp8"), registry=registry)
    engine.add_request("a", [3, 4, 5, 6], SamplingParams(max_tokens=2, temperature=0.0, logprobs=1))
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert float(engine.runner.kv.k[0].float().abs().max()) == FP8_MAX
    assert not torch.isnan(engine.runner.kv.k[0].float()).any()
    assert all(lp == lp for out in outs for lp in (out.logprobs or ()) if isinstance(lp, float))


def test_layers_sharing_storage_never_write_back_stale_rows():
    """KV groups of a windowed model share pool tensors: a block layer 0 held (calibrating) and
    that layer 1 (another group) wrote since must keep layer 1's row through both freezes."""
    layout = KVLayout(num_layers=2, num_kv_heads=1, head_dim=4, dtype=FP8_DTYPE, windows=(None, 4))
    codec = Fp8KVCodec(1, [torch.tensor(1.0)] * 2, [torch.tensor(1.0)] * 2, ["calibration"] * 2, calibration_tokens=100)
    cache = PagedKVCache.allocate(layout, num_blocks=4, block_size=2, codec=codec)
    assert cache.k[0] is cache.k[1]
    stale, fresh = torch.full((1, 1, 4), 3.0), torch.full((1, 1, 4), -5.0)
    cache.write(0, torch.tensor([3]), stale, stale)  # layer 0's block 1, later slid out
    cache.write(1, torch.tensor([3]), fresh, fresh)  # block 1 now belongs to layer 1's group
    for layer in (1, 0):
        codec._freeze(cache, layer, codec.calibrations[layer])
    k, v = cache.gather(1, torch.tensor([1]), torch.float32)
    assert torch.allclose(k[1], fresh[0], rtol=0.07) and torch.allclose(v[1], fresh[0], rtol=0.07)
