"""The MoE block (``metrale_core.layers.blocks.moe``) and the per-expert store (``weights.ExpertSlices``).

Routing against its definition (softmax vs sigmoid, top-k renormalisation, the selection-only
correction bias, DeepSeek's group-limited top-k and scaling against transformers' own routers),
the grouped experts against a row-by-row dense reference, the shared expert's
sigmoid gate, batch invariance on Q8_0 experts multiplied by the GGUF kernels, expert slices
served as views of the stacked tensor's bytes, and lazy experts paging in only what is called.
"""

from __future__ import annotations

import ctypes
import mmap
import os

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

from metrale_core.decoder.names import LLAMA_NAMES
from metrale_core.layers.blocks.moe import (
    FEW_PAIRS,
    Expert,
    Groups,
    MoeBlock,
    RowwiseLinear,
    grouped_experts,
    route,
    swiglu_oai,
)
from metrale_core.layers.formats import gguf_linear as gl
from metrale_core.layers.formats.linear_kinds import DenseLinear
from metrale_core.layers.pointwise.norm_ops import SwiGLU
from metrale_core.weights import ExpertSlices, RawTensor
from metrale_core.weights.gguf_store import GGUFStore

Q8 = GGMLQuantizationType.Q8_0
E, D, I = 8, 64, 32  # noqa: E741 -- the expert width, as the configs name it


def _silu_glu(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def _dense_experts(gen: torch.Generator, n: int = E) -> list[Expert]:
    return [
        Expert(
            DenseLinear(0.1 * torch.randn(2 * I, D, generator=gen)), DenseLinear(0.1 * torch.randn(D, I, generator=gen))
        )
        for _ in range(n)
    ]


def test_softmax_routing_is_top_k_of_the_softmax_with_optional_renormalisation():
    logits = torch.randn(5, E, generator=torch.Generator().manual_seed(0))
    probs = torch.softmax(logits, dim=-1)
    w, ids = route(logits, 3)
    assert torch.equal(ids, probs.topk(3).indices) and torch.equal(w, probs.topk(3).values)
    w_norm, ids_norm = route(logits, 3, normalize=True)
    assert torch.equal(ids_norm, ids)
    torch.testing.assert_close(w_norm, w / w.sum(-1, keepdim=True))
    torch.testing.assert_close(w_norm.sum(-1), torch.ones(5))


def test_sigmoid_routing_scores_each_expert_alone():
    logits = torch.randn(4, E, generator=torch.Generator().manual_seed(1))
    w, ids = route(logits, 2, scoring="sigmoid")
    assert torch.equal(ids, logits.topk(2).indices)  # sigmoid is monotonic
    torch.testing.assert_close(w, torch.sigmoid(logits).gather(-1, ids))
    assert not torch.allclose(w.sum(-1), torch.ones(4))  # not a distribution unless renormalised
    with pytest.raises(ValueError, match="unknown router scoring"):
        route(logits, 2, scoring="relu")  # type: ignore[arg-type]


def test_the_correction_bias_chooses_but_does_not_weigh():
    logits = torch.zeros(1, 4)
    logits[0, 0] = 1.0
    bias = torch.tensor([0.0, 0.0, 0.0, 5.0])
    w, ids = route(logits, 1, scoring="sigmoid", bias=bias)
    assert ids.tolist() == [[3]]  # chosen by the bias ...
    torch.testing.assert_close(w, torch.sigmoid(torch.tensor([[0.0]])))  # ... weighed without it
    w, ids = route(logits, 1, scoring="sigmoid")
    assert ids.tolist() == [[0]]


def _hf_router(version: int, **config):
    """transformers' DeepSeek-V``version`` router with random weights (and correction bias)."""
    import transformers as tf

    cls = tf.DeepseekV2Config if version == 2 else tf.DeepseekV3Config
    model = tf.models.deepseek_v2.modeling_deepseek_v2 if version == 2 else tf.models.deepseek_v3.modeling_deepseek_v3
    router_cls = model.DeepseekV2TopkRouter if version == 2 else model.DeepseekV3TopkRouter
    router = router_cls(cls(hidden_size=D, n_routed_experts=16, **config))
    gen = torch.Generator().manual_seed(version)
    with torch.no_grad():
        router.weight.copy_(torch.randn(16, D, generator=gen))
        if version == 3:
            router.e_score_correction_bias.copy_(0.2 * torch.rand(16, generator=gen))
    return router


@pytest.mark.parametrize(
    ("version", "config", "groups", "scoring"),
    [
        (2, dict(topk_method="group_limited_greedy", n_group=4, topk_group=2), Groups(4, 2, "max"), "softmax"),
        (2, dict(topk_method="greedy"), None, "softmax"),
        (3, dict(n_group=4, topk_group=2, norm_topk_prob=True), Groups(4, 2, "top2"), "sigmoid"),
        (3, dict(n_group=1, topk_group=1, norm_topk_prob=False), None, "sigmoid"),
    ],
)
def test_deepseek_routing_equals_transformers_routers(version, config, groups, scoring):
    """Group-limited top-k (V2: a group's best score; V3: its two best biased scores), the
    correction bias, renormalisation and ``routed_scaling_factor``, as transformers routes."""
    router = _hf_router(version, num_experts_per_tok=3, routed_scaling_factor=2.5, **config)
    x = torch.randn(40, D, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        logits, ref_weights, ref_ids = router(x)
    bias = router.e_score_correction_bias if version == 3 else None
    normalize = bool(config.get("norm_topk_prob"))
    weights, ids = route(logits, 3, scoring, normalize, bias, groups=groups, scale=2.5)
    order = ref_ids.argsort(dim=-1)  # transformers' top-k is unsorted: compare as sets
    assert torch.equal(ids.sort(dim=-1).values, ref_ids.gather(-1, order))
    assert torch.allclose(weights.gather(-1, ids.argsort(dim=-1)), ref_weights.gather(-1, order), atol=1e-6)
    if groups is not None:  # the groups matter: without them some row chooses otherwise
        assert not torch.equal(route(logits, 3, scoring, normalize, bias)[1].sort(-1).values, ids.sort(-1).values)


def test_grouped_experts_equal_each_row_s_weighted_sum():
    gen = torch.Generator().manual_seed(2)
    experts = _dense_experts(gen)
    x = torch.randn(9, D, generator=gen)
    w, ids = route(torch.randn(9, E, generator=gen), 3, normalize=True)
    y = grouped_experts(x, w, ids, experts, _silu_glu)
    ref = torch.stack(
        [sum(w[r, j] * experts[int(ids[r, j])](x[r : r + 1], _silu_glu)[0] for j in range(3)) for r in range(9)]
    )
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)


def test_a_few_pairs_one_by_one_give_the_grouped_bits():
    """Decode (at most ``FEW_PAIRS`` (row, slot) pairs) calls each pair's expert on its row; a row
    gets the same bits that way as grouped with others (row-invariant experts: the C router
    product, an exact gate)."""
    gen = torch.Generator().manual_seed(11)
    experts = [
        Expert(
            gate_up=RowwiseLinear(torch.randn(2 * I, D, generator=gen)),
            down=RowwiseLinear(torch.randn(D, I, generator=gen)),
        )
        for _ in range(E)
    ]

    def relu_glu(gate_up):
        return gate_up[:, :I].clamp(min=0) * gate_up[:, I:]

    rows = FEW_PAIRS // 3 + 3  # grouped: more pairs than FEW_PAIRS
    x = torch.randn(rows, D, generator=gen)
    w, ids = route(torch.randn(rows, E, generator=gen), 3, normalize=True)
    batched = grouped_experts(x, w, ids, experts, relu_glu)
    for r in range(rows):
        alone = grouped_experts(x[r : r + 1], w[r : r + 1], ids[r : r + 1], experts, relu_glu)
        assert torch.equal(alone, batched[r : r + 1]), r


def test_an_empty_batch_gives_no_rows():
    gen = torch.Generator().manual_seed(7)
    block = MoeBlock(
        RowwiseLinear(torch.randn(E, D, generator=gen)),
        tuple(_dense_experts(gen)),
        top_k=2,
        scoring="sigmoid",
        shared=_dense_experts(gen, 1)[0],
        shared_gate=RowwiseLinear(torch.randn(1, D, generator=gen)),
        rowwise=True,
    )
    assert block(torch.zeros(0, D), _silu_glu).shape == (0, D)


def test_the_shared_expert_is_added_times_the_sigmoid_of_its_gate():
    gen = torch.Generator().manual_seed(3)
    experts = _dense_experts(gen)
    shared = _dense_experts(gen, 1)[0]
    router = DenseLinear(torch.randn(E, D, generator=gen))
    gate = DenseLinear(torch.randn(1, D, generator=gen))
    x = torch.randn(6, D, generator=gen)
    routed = MoeBlock(router, tuple(experts), top_k=2)(x, _silu_glu)
    plain = MoeBlock(router, tuple(experts), top_k=2, shared=shared)(x, _silu_glu)
    gated = MoeBlock(router, tuple(experts), top_k=2, shared=shared, shared_gate=gate)(x, _silu_glu)
    torch.testing.assert_close(plain, routed + shared(x, _silu_glu))
    torch.testing.assert_close(gated, routed + torch.sigmoid(gate(x)) * shared(x, _silu_glu))


def _q8_stack(gen: torch.Generator, rows: int, cols: int) -> RawTensor:
    a = (0.1 * torch.randn(E, rows, cols, generator=gen)).numpy()
    return RawTensor(quantize(a, Q8), "Q8_0", (E, rows, cols))


class _Store:
    """The store surface ``ExpertSlices`` reads: stacked raw tensors by name."""

    format = "gguf"

    def __init__(self, raws: dict[str, RawTensor]) -> None:
        self.raws = raws

    def __contains__(self, name: object) -> bool:
        return name in self.raws

    def shape(self, name: str) -> tuple[int, ...]:
        return self.raws[name].shape

    def quant_type(self, name: str) -> str:
        return self.raws[name].quant_type

    def get_raw(self, name: str) -> RawTensor:
        return self.raws[name]


def test_expert_slices_are_views_of_the_stacked_bytes_and_dequantize_alone():
    gen = torch.Generator().manual_seed(4)
    stacked = _q8_stack(gen, I, D)
    store = ExpertSlices(_Store({"blk.0.ffn_up_exps.weight": stacked}))
    name = LLAMA_NAMES.gguf("expert_up", 0, "weight", 3)
    assert name == "blk.0.ffn_up_exps.weight[3]" and name in store
    assert LLAMA_NAMES.hf("expert_up", 0, "weight", 3) == "model.layers.0.mlp.experts.3.up_proj.weight"
    raw = store.get_raw(name)
    assert raw.shape == (I, D) and store.shape(name) == (I, D) and store.quant_type(name) == "Q8_0"
    assert np.shares_memory(raw.data, stacked.data)
    full = dequantize(stacked.data, Q8).reshape(E, I, D)
    assert torch.equal(store.get(name, shape=(I, D)), torch.from_numpy(full[3]))
    with pytest.raises(Exception, match="has no expert 8"):
        store.get_raw("blk.0.ffn_up_exps.weight[8]")


def test_expert_slice_selectors_read_transformers_stacked_layout():
    """gpt-oss's ``gate_up_proj`` ``[E, D, 2I]`` (gate / up interleaved by column) and its
    ``[E, 2I]`` bias: ``[e][s::2].T`` is expert e's gate (s=0) or up (s=1) ``[I, D]``, and its bias;
    the selectors never split a quantized tensor's blocks."""
    gen = torch.Generator().manual_seed(7)
    gate_up, bias = torch.randn(E, D, 2 * I, generator=gen), torch.randn(E, 2 * I, generator=gen)
    store = ExpertSlices(
        _Store({"gu": RawTensor(gate_up, "F32", (E, D, 2 * I)), "gu_bias": RawTensor(bias, "F32", (E, 2 * I))})
    )
    names = LLAMA_NAMES.replace(expert_up=("gu{suffix}[{e}][1::2].T", "unused"))
    weight, b = names.hf("expert_up", 0, "weight", 2), names.hf("expert_up", 0, "bias", 2)
    assert (weight, b) == ("gu[2][1::2].T", "gu_bias[2][1::2].T")
    assert store.shape(weight) == (I, D) and store.shape(b) == (I,)
    got = store.get(weight, shape=(I, D))
    assert torch.equal(got, gate_up[2, :, 1::2].T) and got.is_contiguous()
    assert torch.equal(store.get(b, shape=(I,)), bias[2, 1::2])
    quantized = ExpertSlices(_Store({"q": _q8_stack(gen, I, D)}))
    with pytest.raises(Exception, match="cannot be strided or transposed"):
        quantized.get_raw("q[1][0::2]")


def test_rowwise_sigmoid_routing_is_batch_invariant():
    """torch's elementwise sigmoid runs a tensor's tail through its scalar function (other bits):
    ``rowwise`` gives every row the same path whatever the row count."""
    logits = torch.randn(33, E, generator=torch.Generator().manual_seed(6))
    alone = [route(logits[r : r + 1], 3, "sigmoid", normalize=True, rowwise=True) for r in range(33)]
    w, ids = route(logits, 3, "sigmoid", normalize=True, rowwise=True)
    assert torch.equal(w, torch.cat([a[0] for a in alone])) and torch.equal(ids, torch.cat([a[1] for a in alone]))
    torch.testing.assert_close(w, route(logits, 3, "sigmoid", normalize=True)[0])


def test_a_row_s_result_is_the_same_bits_alone_and_in_any_batch():
    """Q8_0 experts on the GGUF kernels, the C SwiGLU, a row-wise router and shared gate:
    batch-invariant end to end."""
    swiglu = SwiGLU(torch.device("cpu"))
    if swiglu.path != "cpu" or gl.gguf_kernel() is None:
        pytest.skip("the C kernels do not run here (the torch fallbacks are not batch-invariant)")
    gen = torch.Generator().manual_seed(5)
    raws = {"gate": _q8_stack(gen, I, D), "up": _q8_stack(gen, I, D), "down": _q8_stack(gen, D, I)}
    store = ExpertSlices(_Store(raws))
    experts = tuple(
        Expert(
            gl.gguf_linear([store.get_raw(f"gate[{e}]"), store.get_raw(f"up[{e}]")]),
            gl.gguf_linear([store.get_raw(f"down[{e}]")]),
        )
        for e in range(E)
    )
    shared = Expert(gl.gguf_linear([store.get_raw("gate[0]"), store.get_raw("up[0]")]), experts[1].down)
    block = MoeBlock(
        RowwiseLinear(torch.randn(E, D, generator=gen)),
        experts,
        top_k=3,
        normalize=True,
        shared=shared,
        shared_gate=RowwiseLinear(torch.randn(1, D, generator=gen)),
        rowwise=True,
    )
    x = torch.randn(33, D, generator=gen)
    alone = torch.cat([block(x[r : r + 1], swiglu) for r in range(33)])
    for rows in (2, 7, 33):
        assert torch.equal(block(x[:rows], swiglu), alone[:rows])
    assert torch.equal(block(x.flip(0), swiglu).flip(0), alone)


def test_topk_softmax_routing_is_gpt_oss_router():
    """gpt-oss: the top-k logits chosen, then softmax over those k (transformers' GptOssTopKRouter)."""
    logits = torch.randn(5, 8, generator=torch.Generator().manual_seed(4))
    w, ids = route(logits, 3, scoring="topk_softmax")
    top, want_ids = torch.topk(logits, 3, dim=-1)
    assert torch.equal(ids, want_ids) and torch.equal(w, torch.softmax(top, dim=1))


def test_swiglu_oai_is_gpt_oss_gate_on_deinterleaved_halves():
    """transformers' ``GptOssExperts._apply_gate`` on HF's interleaved columns equals
    :func:`swiglu_oai` on the ``[gate; up]`` halves, the clamp reached on both sides."""
    x = 3.0 * torch.randn(6, 16, generator=torch.Generator().manual_seed(5))
    interleaved = torch.stack([x[:, :8], x[:, 8:]], dim=-1).reshape(6, 16)
    gate, up = interleaved[..., ::2].clamp(max=2.0), interleaved[..., 1::2].clamp(-2.0, 2.0)
    want = (up + 1) * (gate * torch.sigmoid(gate * 1.702))
    assert (x[:, :8] > 2.0).any() and (x[:, 8:] < -2.0).any()
    assert torch.equal(swiglu_oai(x, 1.702, 2.0), want)
    # row by row the sigmoid may take torch's other (vector / scalar) path: equal to rounding
    assert torch.allclose(swiglu_oai(x, 1.702, 2.0, rowwise=True), want, rtol=1e-6, atol=1e-7)


def test_rowwise_linear_adds_its_bias():
    g = torch.Generator().manual_seed(6)
    w, b, x = torch.randn(4, 8, generator=g), torch.randn(4, generator=g), torch.randn(3, 8, generator=g)
    assert torch.allclose(RowwiseLinear(w, b)(x), x @ w.T + b, atol=1e-6)


def _present_pages(start: int, nbytes: int) -> tuple[int, int]:
    """``(present, total)`` pages of this process's mapping in ``[start, start + nbytes)``
    (``/proc/self/pagemap``: bit 63 of a page's entry is set while the page is mapped)."""
    page = os.sysconf("SC_PAGE_SIZE")
    first, last = start // page, (start + nbytes - 1) // page
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = np.frombuffer(f.read((last - first + 1) * 8), dtype="<u8")
    return int((entries >> np.uint64(63)).sum()), len(entries)


def _no_readahead(start: int, nbytes: int) -> None:
    """``madvise(MADV_RANDOM)`` over the pages of ``[start, start + nbytes)``: a fault reads its
    own page only (no readahead of the neighbours, which would map them with it)."""
    page = os.sysconf("SC_PAGE_SIZE")
    first = start // page * page
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.madvise(first, start + nbytes - first, mmap.MADV_RANDOM) == 0, os.strerror(ctypes.get_errno())


@pytest.mark.skipif(not os.path.exists("/proc/self/pagemap"), reason="needs Linux's /proc/self/pagemap")
def test_lazy_experts_page_in_only_the_routed_experts_of_the_mapped_file(tmp_path):
    """Experts built ``lazy`` from a memory-mapped GGUF (as the decoder builds routed experts
    under ``auto``) map none of their pages until called; calling experts 2 and 5 maps all of
    theirs and none of the experts away from them (each expert spans 68 pages, more than the
    kernel's 16-page fault-around window; the file is out of the page cache and read without
    readahead, so only what is read is mapped)."""
    experts, rows, cols = 8, 256, 1024
    stacked = (0.1 * torch.randn(experts, rows, cols, generator=torch.Generator().manual_seed(8))).numpy()
    path = tmp_path / "experts.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_embedding_length(cols)
    writer.add_head_count(8)
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_tensor("blk.0.ffn_up_exps.weight", quantize(stacked, Q8), raw_dtype=Q8)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    fd = os.open(path, os.O_RDONLY)
    try:  # out of the page cache, so a page is mapped only when read (never as a cached neighbour)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    gguf = GGUFStore(path)
    store = ExpertSlices(gguf)
    raws = [store.get_raw(f"blk.0.ffn_up_exps.weight[{e}]") for e in range(experts)]
    lazy = [gl.gguf_linear([r], lazy=True) for r in raws]
    gguf.drop_resident_pages()  # as the loader does after building the model
    spans = [(np.asarray(r.data).ctypes.data, np.asarray(r.data).nbytes) for r in raws]
    _no_readahead(spans[0][0], spans[-1][0] + spans[-1][1] - spans[0][0])
    assert all(_present_pages(*span)[0] == 0 for span in spans)
    x = torch.randn(3, cols, generator=torch.Generator().manual_seed(9))
    for e in (2, 5):
        assert torch.equal(lazy[e](x), gl.gguf_linear([raws[e]])(x))
    present = [_present_pages(*span) for span in spans]
    for e in (2, 5):
        assert present[e][0] == present[e][1], (e, present)
    for e in (0, 7):
        assert present[e][0] == 0, (e, present)
    assert all(p.pending for e, p in enumerate(lazy) if e not in (2, 5))
