"""The MoE weight loading of the decoder definition under tensor parallelism (issue 31): each rank
keeps a part of every expert's width, the router whole, and the expert biases are added once.

A definition with biased experts and a shared expert (``Mlp(bias="always")``, gpt-oss-like biases
on a plain SwiGLU) over an in-memory checkpoint: the two ranks' block outputs, with the
all-reduce recorded instead of run, sum to the unsharded block's -- which holds only if each
down bias is added by one rank, not by both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from metrale_core.decoder.spec import DecoderSpec, Mlp
from metrale_core.layers.parallel import TensorParallel
from metrale_core.plugin.components import LoadOptions

SPEC = DecoderSpec("biasmoe", ("BiasMoeForCausalLM",), mlp=Mlp(kind="moe", bias="always", shared_experts=True))
D, HEADS, HEAD_DIM, VOCAB, EXPERTS, WIDTH, SHARED = 8, 2, 4, 16, 3, 64, 32
CONFIG = {
    "model_type": "biasmoe",
    "architectures": ["BiasMoeForCausalLM"],
    "vocab_size": VOCAB,
    "hidden_size": D,
    "intermediate_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": HEADS,
    "num_key_value_heads": HEADS,
    "head_dim": HEAD_DIM,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 64,
    "tie_word_embeddings": True,
    "num_experts": EXPERTS,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": WIDTH,
    "shared_expert_intermediate_size": SHARED,
}


def _shapes() -> dict[str, tuple[int, ...]]:
    a, m = "model.layers.0.self_attn.", "model.layers.0.mlp."
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (VOCAB, D),
        "model.norm.weight": (D,),
        "model.layers.0.input_layernorm.weight": (D,),
        "model.layers.0.post_attention_layernorm.weight": (D,),
        **{f"{a}{p}_proj.weight": (HEADS * HEAD_DIM, D) for p in "qkv"},
        f"{a}o_proj.weight": (D, HEADS * HEAD_DIM),
        f"{m}gate.weight": (EXPERTS, D),
        f"{m}gate.bias": (EXPERTS,),
    }
    experts = [(f"{m}experts.{e}.", WIDTH) for e in range(EXPERTS)] + [(f"{m}shared_expert.", SHARED)]
    for prefix, width in experts:
        for p in ("gate", "up"):
            shapes[f"{prefix}{p}_proj.weight"], shapes[f"{prefix}{p}_proj.bias"] = (width, D), (width,)
        shapes[f"{prefix}down_proj.weight"], shapes[f"{prefix}down_proj.bias"] = (D, width), (D,)
    return shapes


class _Store:
    """A checkpoint in memory: random tensors of :func:`_shapes` (exact format reads only ``get``)."""

    format = "safetensors"
    config = CONFIG

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(3)
        self.tensors = {n: torch.randn(s, generator=gen) for n, s in _shapes().items()}

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.tensors[name].shape)

    def get(self, name: str, *, dtype: torch.dtype = torch.float32, shape=None) -> torch.Tensor:
        t = self.tensors[name]
        assert shape is None or tuple(shape) == tuple(t.shape), (name, shape)
        return t.to(dtype).clone()


def _block(rank: int, world: int):
    tp = TensorParallel(rank=rank, world=world)
    options = LoadOptions(dtype="float32", device="cpu", weight_format="exact", tensor_parallel=tp)
    return SPEC.load(_Store(), options).weights.layers[0].moe


def _swiglu(h: torch.Tensor) -> torch.Tensor:
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


def test_the_ranks_parts_sum_to_the_block_with_each_bias_added_once(monkeypatch):
    assert SPEC.tensor_parallel_note == ""
    whole, parts = _block(0, 1), [_block(r, 2) for r in range(2)]
    assert whole.tp is None and [p.tp.rank for p in parts] == [0, 1]
    for rank, block in enumerate(parts):
        expert = block.experts[1]
        assert expert.gate_up.out_features == WIDTH and expert.down.weight.shape == (D, WIDTH // 2)
        assert block.shared.gate_up.out_features == SHARED and block.router.out_features == EXPERTS
        # gate/up biases split with their rows; the down's bias only on rank 0
        assert expert.gate_up.bias.shape == (WIDTH,)
        assert (expert.down.bias is None) == (rank == 1) and (block.shared.down.bias is None) == (rank == 1)
    store = _Store()
    down = "model.layers.0.mlp.experts.1.down_proj."
    assert torch.equal(parts[0].experts[1].down.bias, store.tensors[down + "bias"])
    assert torch.equal(parts[1].experts[1].down.weight, store.tensors[down + "weight"][:, WIDTH // 2 :])
    reduced = []
    monkeypatch.setattr(TensorParallel, "all_reduce", lambda self, x: reduced.append(self.rank) or x)
    x = torch.randn(5, D, generator=torch.Generator().manual_seed(1))
    expected = whole(x, _swiglu)
    got = [block(x, _swiglu) for block in parts]
    assert reduced == [0, 1]
    assert torch.allclose(got[0] + got[1], expected, atol=1e-4, rtol=1e-5), (got[0] + got[1] - expected).abs().max()
