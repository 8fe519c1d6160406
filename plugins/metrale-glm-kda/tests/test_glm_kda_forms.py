"""KDA building blocks: chunked vs recurrent forms, conv prefill vs decode, the decode ops, and
the MoE block against transformers' modules."""

from __future__ import annotations

import pytest
import torch

from metrale_core.layers import DenseLinear
from metrale_glm_kda import kda
from metrale_glm_kda import moe as moe_module
from metrale_glm_kda.moe import MlpWeights, MoeWeights, moe_forward, route
from metrale_glm_kda.ops import KdaDecodeStep, MoeRouting, ShortConvUpdate


def _inputs(T, H=3, K=16, V=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = kda.prepare_qk(torch.randn(T, H, K, generator=g), torch.randn(T, H, K, generator=g))
    v = torch.randn(T, H, V, generator=g)
    gate = kda.forget_gate(
        torch.randn(T, H * K, generator=g), torch.randn(H * K, generator=g), torch.randn(H, generator=g) * 0.5, -5.0
    )
    beta = torch.sigmoid(torch.randn(T, H, generator=g))
    state = torch.randn(H, K, V, generator=g)
    return q, k, v, gate, beta, state


@pytest.mark.parametrize("T", [1, 7, 63, 64, 65, 300])
def test_chunked_equals_recurrent_with_initial_state(T):
    q, k, v, g, beta, s0 = _inputs(T, seed=T)
    o_rec, s_rec = kda.kda_recurrent(q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None], s0[None])
    o_chk, s_chk = kda.kda_chunked(q, k, v, g, beta, s0)
    assert (o_rec[:, 0] - o_chk).abs().max().item() <= 1e-5
    assert (s_rec[0] - s_chk).abs().max().item() <= 1e-5
    assert s_rec.abs().max() > 0.1 and not torch.equal(s_rec[0], s0)


def test_chunked_state_carries_across_split_prefill():
    q, k, v, g, beta, s0 = _inputs(150, seed=5)
    o_all, s_all = kda.kda_chunked(q, k, v, g, beta, s0)
    o_a, s_mid = kda.kda_chunked(q[:70], k[:70], v[:70], g[:70], beta[:70], s0)
    o_b, s_end = kda.kda_chunked(q[70:], k[70:], v[70:], g[70:], beta[70:], s_mid)
    assert (torch.cat([o_a, o_b]) - o_all).abs().max().item() <= 1e-5
    assert (s_end - s_all).abs().max().item() <= 1e-5


def test_softplus_gate_matches_formula():
    raw, dt, a_log = torch.randn(5, 6) * 10, torch.randn(6), torch.randn(2)
    g = kda.forget_gate(raw, dt, a_log, None)
    z = (raw + dt).view(5, 2, 3)
    want = -torch.exp(a_log).view(1, 2, 1) * torch.nn.functional.softplus(z)
    assert torch.allclose(g, want, atol=1e-5) and (g <= 0).all()


def test_conv_prefill_then_decode_equals_one_prefill():
    g = torch.Generator().manual_seed(1)
    C, W = 12, 4
    x, weight = torch.randn(9, C, generator=g), torch.randn(C, W, generator=g)
    y_all, st_all = kda.conv_prefill(x, torch.zeros(C, W - 1), weight)
    y_a, st = kda.conv_prefill(x[:5], torch.zeros(C, W - 1), weight)
    pool, slots = torch.zeros(3, C, W - 1), torch.tensor([2])
    pool[2] = st
    op = ShortConvUpdate("cpu")
    ys = [op(x[t][None], pool, weight, slots)[0] for t in range(5, 9)]
    assert torch.allclose(torch.cat([y_a, torch.stack(ys)]), y_all, atol=1e-6)
    assert torch.allclose(pool[2], st_all) and pool[:2].abs().sum() == 0


def test_decode_step_op_updates_only_its_slots():
    _q, _k, v, g, beta, _ = _inputs(2, seed=9)
    raw_q, raw_k = torch.randn(2, 3, 16), torch.randn(2, 3, 16)
    pool = torch.randn(4, 3, 16, 8)
    before = pool.clone()
    slots = torch.tensor([3, 1])
    out = KdaDecodeStep("cpu")(raw_q, raw_k, v, g, beta, pool, slots)
    qn, kn = kda.prepare_qk(raw_q, raw_k)
    want, state = kda.kda_recurrent(qn[None], kn[None], v[None], g[None], beta[None], before[slots])
    assert torch.allclose(out, want[0], atol=1e-6)
    assert torch.allclose(pool[slots], state, atol=1e-6)
    assert torch.equal(pool[[0, 2]], before[[0, 2]])


@pytest.mark.parametrize("experts_path", ["dense", "per_expert"])
@pytest.mark.parametrize("n_group,topk_group", [(1, 1), (4, 2)])
def test_moe_block_matches_transformers(n_group, topk_group, experts_path, monkeypatch):
    if experts_path == "per_expert":
        monkeypatch.setattr(moe_module, "DENSE_LIMIT", 0)
    import transformers
    from transformers.models.glm5_next.modeling_glm5_next import Glm5NextTextMoE

    cfg = transformers.Glm5NextTextConfig(
        hidden_size=16,
        moe_intermediate_size=8,
        n_routed_experts=8,
        num_experts_per_tok=3,
        n_group=n_group,
        topk_group=topk_group,
        n_shared_experts=1,
        q_lora_rank=8,
        swiglu_limit=0.5,
    )
    torch.manual_seed(0)
    hf = Glm5NextTextMoE(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.5)
        hf.gate.e_score_correction_bias.normal_(0, 0.1)
    w = MoeWeights(
        router=hf.gate.weight.detach(),
        bias=hf.gate.e_score_correction_bias,
        gate_up=hf.experts.gate_up_proj.detach(),
        down=hf.experts.down_proj.detach(),
        shared=MlpWeights(
            gate_up=DenseLinear(
                torch.cat([hf.shared_experts.gate_proj.weight, hf.shared_experts.up_proj.weight]).detach()
            ),
            down=DenseLinear(hf.shared_experts.down_proj.weight.detach()),
        ),
    )
    router = MoeRouting("cpu", top_k=3, n_group=n_group, topk_group=topk_group, norm_topk_prob=True, scaling=2.5)
    x = torch.randn(40, 16)
    with torch.no_grad():
        want = hf(x[None])[0]
        _, hf_w, hf_idx = hf.gate(x)
    weights, experts = route(x @ w.router.t(), w.bias, 3, n_group, topk_group, True, 2.5)
    assert torch.equal(experts.sort(-1).values, hf_idx.sort(-1).values)
    assert torch.allclose(weights.gather(1, experts.argsort(-1)), hf_w.gather(1, hf_idx.argsort(-1)), atol=1e-6)
    got = moe_forward(x, w, 0.5, router)
    assert (got - want).abs().max().item() <= 1e-5
