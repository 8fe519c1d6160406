"""Qwen3-MoE and Qwen2-MoE under tensor parallelism (issue 31): TP=2 (a worker process, gloo on
loopback) against TP=1 through the real engine path -- chunked prefill, batched decode, a forced
preemption -- from an HF checkpoint and from a GGUF written under llama.cpp's names.

Each rank keeps a part of every expert's width (rows of gate/up, columns of down; the shared
expert's too), the router and the shared expert's gate whole; the block's output is summed over
the ranks once.  The oracle is the unsharded model: the same greedy tokens, logits within float
tolerance (the two ranks' partial sums are added in another order than one rank's dot products).
Under ``auto`` the GGUF's experts stay Q8_0 blocks on the block kernels, each rank's part repacked
on first use from its own view of the mapped file, into the repack cache under the part's name.
"""

from __future__ import annotations

import family_testlib
import pytest
import torch
from qwen3_harness import open_store
from test_moe_families import FAMILIES, GGUF_CONFIGS, _hf, _write_gguf

from metrale_core.api import LoadOptions
from metrale_core.layers.formats import gguf_repack, repack_cache
from metrale_core.layers.formats.gguf_linear import GGUFLinear
from metrale_core.layers.parallel import TensorParallel
from metrale_core.plugin.discovery import load_registry
from metrale_core.testing.tp_oracle import assert_tp2_matches_tp1, run_engine, write_word_tokenizer

PROMPTS = [[(7 * i + 3 * j) % 90 + 3 for j in range(9 + 4 * i)] for i in range(4)]
#: One HF config per family: Qwen3-MoE with a dense layer among the sparse ones (its own MLP split
#: too), Qwen2-MoE with its shared expert and the shared expert's gate.
HF_CASES = {"qwen3moe": "renorm-mlp-only-layer", "qwen2moe": "shared-gated-no-renorm"}
#: The family tests' GGUF configs, with every split between Q8_0 blocks of 32: each expert's 64
#: columns of down as 32 + 32, the shared expert's 128 as 64 + 64, o_proj's 64 as 32 + 32.
GGUF_CASES = {
    "qwen3moe": dict(GGUF_CONFIGS["qwen3moe"], moe_intermediate_size=64, num_experts=8, num_experts_per_tok=3),
    "qwen2moe": dict(
        GGUF_CONFIGS["qwen2moe"],
        moe_intermediate_size=64,
        shared_expert_intermediate_size=128,
        num_experts=8,
        num_experts_per_tok=2,
    ),
}


def _engine_run(model):
    # 10 blocks of 4 tokens for 4 sequences of up to 33 tokens: a preemption is certain.
    return run_engine(model, PROMPTS, num_kv_blocks=10, max_tokens=12)


def _hf_checkpoint(family, directory):
    """A random checkpoint of ``HF_CASES[family]`` with a word-level tokenizer (load_model wants one)."""
    hf = _hf(family, 11, FAMILIES[family][2][HF_CASES[family]])
    hf.save_pretrained(directory, safe_serialization=True)
    write_word_tokenizer(directory, hf.config.vocab_size)
    return directory


def _gguf(family, directory, monkeypatch):
    """``GGUF_CASES[family]`` written by the MoE family tests' writer, with a tokenizer type (its
    token list is ``t0``, ``t1``, ...: load_model reads a tokenizer from the file)."""
    header = family_testlib.gguf_header

    def with_tokenizer(*args, **kwargs):
        w = header(*args, **kwargs)
        w.add_tokenizer_model("gpt2")
        return w

    monkeypatch.setattr(family_testlib, "gguf_header", with_tokenizer)
    path = directory / f"{family}.gguf"
    _write_gguf(family, _hf(family, 13, GGUF_CASES[family]), path)
    return path


@pytest.mark.parametrize("family", sorted(HF_CASES))
def test_hf_checkpoint_at_tp2_matches_tp1_through_the_engine(family, tmp_path):
    assert load_registry().model_loaders[family].tensor_parallel
    assert_tp2_matches_tp1(_hf_checkpoint(family, tmp_path), LoadOptions(weight_format="exact"), _engine_run, atol=1e-5)


@pytest.mark.parametrize("family", sorted(GGUF_CASES))
@pytest.mark.parametrize(("weight_format", "atol"), [("exact", 1e-5), ("auto", 1e-4)])
def test_gguf_at_tp2_matches_tp1_through_the_engine(family, weight_format, atol, tmp_path, monkeypatch):
    path = _gguf(family, tmp_path, monkeypatch)
    assert_tp2_matches_tp1(path, LoadOptions(weight_format=weight_format), _engine_run, atol=atol)


def _rank_model(path, rank, world):
    """Rank ``rank`` of ``world``'s model, built in this process (loading runs no collective)."""
    spec = load_registry().find_model_loader(open_store(path).config)
    options = LoadOptions(weight_format="auto", tensor_parallel=TensorParallel(rank=rank, world=world))
    return spec.factory(open_store(path), options)


def test_the_ranks_parts_of_an_moe_block_sum_to_the_whole_block(tmp_path, monkeypatch):
    """Qwen2-MoE from a GGUF under ``auto``, both ranks of 2 built in this process: rank r keeps
    rows r*32.. of each routed expert's gate and up and the same 32 input columns of its down,
    still pending (no page of the expert read at load), the shared expert's 128 as 64 + 64 (built
    at load), the router and the shared gate whole.  With the all-reduce recorded instead of run,
    the two ranks' outputs of the block sum to the unsharded block's (one all-reduce a call), and
    each rank's half of an expert's gate/up rows are the whole expert's."""
    path = _gguf("qwen2moe", tmp_path, monkeypatch)
    whole = _rank_model(path, 0, 1).weights.layers[1].moe
    parts = [_rank_model(path, r, 2).weights.layers[1].moe for r in range(2)]
    assert whole.tp is None
    for rank, block in enumerate(parts):
        assert block.tp is not None and (block.tp.rank, block.tp.world) == (rank, 2)
        assert all(isinstance(e.gate_up, GGUFLinear) and e.gate_up.pending and e.down.pending for e in block.experts)
        assert block.experts[0].gate_up.out_features == 64 and block.experts[0].down.out_features == 64
        assert block.shared.gate_up.out_features == 128 and not block.shared.gate_up.pending
        assert block.router.out_features == 8 and block.shared_gate.out_features == 1
    reduced = []
    monkeypatch.setattr(TensorParallel, "all_reduce", lambda self, x: reduced.append(self.rank) or x)
    torch.manual_seed(0)
    x = torch.randn(5, 64)
    act = _swiglu
    expected = whole(x, act)
    got = [block(x, act) for block in parts]
    assert reduced == [0, 1]  # once per call of each rank's block
    assert torch.allclose(got[0] + got[1], expected, atol=1e-5, rtol=0), (got[0] + got[1] - expected).abs().max()
    assert not torch.allclose(got[0], expected, atol=1e-3)  # each rank has only a part of the sum
    for e in (0, 5):
        rows = whole.experts[e].gate_up(x)  # [gate; up], 64 rows each
        for rank, block in enumerate(parts):
            mine = block.experts[e].gate_up(x)
            keep = [*range(32 * rank, 32 * rank + 32), *range(64 + 32 * rank, 64 + 32 * rank + 32)]
            assert torch.allclose(mine, rows[:, keep], atol=1e-6, rtol=0)


def _swiglu(h):
    gate, up = h.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def test_a_ranks_experts_are_repacked_on_first_use_into_the_cache(tmp_path, monkeypatch):
    """Each rank's part of an expert is repacked on its first call from its view of the mapped
    file, into the repack cache under the part's own name: loading rank 1 again decodes no block
    and gives the same records; rank 0's parts are other records."""
    monkeypatch.setenv(repack_cache.CACHE_ENV, str(tmp_path / "cache"))
    path = _gguf("qwen3moe", tmp_path, monkeypatch)
    decoded = []
    decode = gguf_repack.decode
    monkeypatch.setattr(gguf_repack, "decode", lambda *a: decoded.append(1) or decode(*a))

    def records(rank):
        """Rank ``rank``'s expert records, and the blocks decoded to repack them (none at load)."""
        blocks = [layer.moe for layer in _rank_model(path, rank, 2).weights.layers]
        pending = all(p.pending for b in blocks for e in b.experts for p in (e.gate_up, e.down))
        at_load = len(decoded)
        got = [p.repacked().records for b in blocks for e in b.experts for p in (e.gate_up, e.down)]
        return got, pending, len(decoded) - at_load

    decoded.clear()
    first, pending, repacked = records(1)
    assert pending and repacked and all(r is not None for r in first)
    decoded.clear()
    again, pending, _ = records(1)
    assert pending and not decoded  # every part of rank 1 (its attention's too) read from the cache
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    other, _, repacked = records(0)
    assert repacked and not torch.equal(other[0], first[0])
