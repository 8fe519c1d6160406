"""CUDA kernels against their torch oracles, and the whole model on the GPU (``gpu`` marker)."""

from __future__ import annotations

import pytest
import torch

from metrale_core.kernels import cupy_unavailable_reason

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    pytest.mark.skipif(cupy_unavailable_reason() is not None, reason=str(cupy_unavailable_reason())),
]

DTYPES = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


def _rand(*shape, dtype):
    return torch.randn(shape, device="cuda").to(dtype)


@pytest.fixture(scope="module")
def ops():
    from metrale_core.layers.decoder_ops import DecoderOps

    built = DecoderOps("cuda")
    assert built.rms_norm.path == "cuda" and built.decode_attention.path == "cuda"
    return built


@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_kernel(ops, dtype):
    x, w = _rand(37, 200, dtype=dtype), _rand(200, dtype=dtype)
    torch.testing.assert_close(
        ops.rms_norm(x, w, 1e-6), ops.rms_norm.forward_native(x, w, 1e-6), rtol=DTYPES[dtype], atol=DTYPES[dtype]
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("use_norm", [True, False])
def test_qk_norm_rope_kernel_on_strided_views(ops, dtype, use_norm):
    from metrale_core.layers.pointwise.functional import rope_cos_sin, rope_inv_freq

    t, hq, hk, d = 9, 8, 2, 128
    qkv = _rand(t, (hq + 2 * hk) * d, dtype=dtype)
    q, k, _ = qkv.split([hq * d, hk * d, hk * d], dim=-1)
    q, k = q.view(t, hq, d), k.view(t, hk, d)
    qw, kw = (_rand(d, dtype=dtype), _rand(d, dtype=dtype)) if use_norm else (None, None)
    cos, sin = rope_cos_sin(torch.arange(3, 3 + t, device="cuda") * 7, rope_inv_freq(d, 1e6).cuda(), dtype)
    ref_q, ref_k = ops.qk_norm_rope.forward_native(q.clone(), k.clone(), qw, kw, cos, sin, 1e-6)
    out_q, out_k = ops.qk_norm_rope(q, k, qw, kw, cos, sin, 1e-6)
    tol = DTYPES[dtype] * 4
    torch.testing.assert_close(out_q, ref_q, rtol=tol, atol=tol)
    torch.testing.assert_close(out_k, ref_k, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_kernel(ops, dtype):
    gate_up = _rand(13, 2 * 300, dtype=dtype)
    torch.testing.assert_close(
        ops.swiglu(gate_up), ops.swiglu.forward_native(gate_up), rtol=DTYPES[dtype], atol=DTYPES[dtype]
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_kv_cache_write_kernel(ops, dtype):
    kv = _rand(5, 2 * 4 * 64, dtype=dtype)
    k, v = (x.view(5, 4, 64) for x in kv.split([256, 256], dim=-1))
    slots = torch.tensor([3, 17, 40, 41, 8], device="cuda")
    caches = [torch.zeros(12, 4, 4, 64, dtype=dtype, device="cuda") for _ in range(4)]
    ops.kv_write(k, v, caches[0], caches[1], slots)
    ops.kv_write.forward_native(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq,hk,d", [(8, 8, 64), (16, 2, 128), (4, 1, 256)])
def test_paged_attention_decode_kernel(ops, dtype, hq, hk, d):
    bs, nb = 16, 40
    k_cache, v_cache = _rand(nb, bs, hk, d, dtype=dtype), _rand(nb, bs, hk, d, dtype=dtype)
    perm = torch.randperm(nb, device="cuda")
    tables = torch.stack([perm[:10], perm[10:20], perm[20:30], perm[30:40]])
    context = torch.tensor([1, 16, 77, 160], device="cuda")
    q = _rand(4, hq, d, dtype=dtype)
    args = (q, k_cache, v_cache, tables, context, d**-0.5, 160)
    tol = DTYPES[dtype] * 2
    torch.testing.assert_close(
        ops.decode_attention(*args), ops.decode_attention.forward_native(*args), rtol=tol, atol=tol
    )


def test_model_on_gpu_matches_hf(tmp_path):
    from qwen3_harness import build_hf, load, max_logit_diff, open_store, run_mixed_schedule, save_checkpoint
    from transformers import Qwen3Config, Qwen3ForCausalLM

    hf = build_hf(
        Qwen3Config,
        Qwen3ForCausalLM,
        seed=7,
        vocab_size=96,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=32,
        tie_word_embeddings=True,
    )
    model = load("qwen3", open_store(save_checkpoint(hf, tmp_path)), device="cuda")
    assert model.ops.qk_norm_rope.path == "cuda"
    runner = run_mixed_schedule(
        model, [[5, 17, 3, 88, 41, 9, 60], [2, 70, 33], [44, 1, 90, 12, 8]], decode_steps=6, device="cuda"
    )
    assert max_logit_diff(hf, runner) <= 1e-3
