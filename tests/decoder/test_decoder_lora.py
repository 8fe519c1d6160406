"""The LoRA targets of the decoder definition (issue 31): declared by the weight loading for every
family, by checkpoint module path and by their path from the model, and wrapped by that path."""

from __future__ import annotations

import pytest
import torch

from metrale_core.decoder.spec import DecoderSpec
from metrale_core.layers import DenseLinear
from metrale_core.layers.lowrank.lora import LoRALinear, attach_lora
from metrale_core.layers.lowrank.lora_targets import resolve
from metrale_core.layers.parallel import RowParallelLinear, TensorParallel
from metrale_core.plugin.components import LoadOptions
from metrale_core.testing.tiny_llama import write_tiny_llama
from metrale_core.weights import open_weights

LLAMA = DecoderSpec("llama", ("LlamaForCausalLM",), "the tiny Llama of metrale_core.testing")
#: write_tiny_llama's shape: 2 layers, hidden 48, 6 heads and 3 KV heads of 8, MLP 64.
Q, KV, D, MLP = 48, 24, 48, 64


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def _load(directory, tp: TensorParallel | None = None):
    options = LoadOptions(dtype="float32", device="cpu", weight_format="exact", tensor_parallel=tp)
    return LLAMA.load(open_weights(directory), options)


def _declared(model) -> dict[str, list[tuple[str, int, int, int]]]:
    return {
        t.dotted: [(p.module, p.offset, p.out_features, p.in_features) for p in t.parts] for t in model.lora_targets()
    }


def test_every_layer_declares_attention_and_mlp_by_module_path_and_not_the_head(checkpoint):
    model = _load(checkpoint)
    want = {}
    for i in range(2):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        want[f"weights.layers.{i}.qkv"] = [
            (a + "q_proj", 0, Q, D),
            (a + "k_proj", Q, KV, D),
            (a + "v_proj", Q + KV, KV, D),
        ]
        want[f"weights.layers.{i}.o_proj"] = [(a + "o_proj", 0, D, Q)]
        want[f"weights.layers.{i}.gate_up"] = [(m + "gate_proj", 0, MLP, D), (m + "up_proj", MLP, MLP, D)]
        want[f"weights.layers.{i}.down"] = [(m + "down_proj", 0, D, MLP)]
    assert _declared(model) == want  # the head and the embedding are not declared
    for target in model.lora_targets():
        assert isinstance(resolve(model, target.path), DenseLinear)


def test_two_models_in_one_process_keep_their_own_targets(checkpoint):
    one, two = _load(checkpoint), _load(checkpoint)
    targets = attach_lora(one, num_slots=2, max_rank=4, dtype=torch.float32, device="cpu")
    assert len(targets) == 2 * 7  # q, k, v, o, gate, up, down per layer
    for layer in one.weights.layers:
        assert all(isinstance(p, LoRALinear) for p in (layer.qkv, layer.o_proj, layer.gate_up, layer.down))
    for layer in two.weights.layers:  # the other model is untouched
        assert not any(isinstance(p, LoRALinear) for p in (layer.qkv, layer.o_proj, layer.gate_up, layer.down))
    assert not isinstance(one.weights.head, LoRALinear)
    again = attach_lora(two, num_slots=2, max_rank=4, dtype=torch.float32, device="cpu")
    assert again.keys() == targets.keys()
    assert all(again[m][0] is not targets[m][0] for m in targets)


def test_under_tensor_parallelism_the_rank_shard_inside_the_row_parallel_wrapper_is_declared(checkpoint):
    model = _load(checkpoint, TensorParallel(rank=1, world=2))
    q, kv = model.num_heads * 8, model.num_kv_heads * 8  # this rank's heads (whole GQA groups)
    assert (q, kv) == (16, 8)
    declared = _declared(model)
    assert declared["weights.layers.0.o_proj.inner"] == [("model.layers.0.self_attn.o_proj", 0, D, q)]
    assert declared["weights.layers.0.qkv"][1] == ("model.layers.0.self_attn.k_proj", q, kv, D)
    attach_lora(model, num_slots=1, max_rank=2, dtype=torch.float32, device="cpu")
    o_proj = model.weights.layers[0].o_proj
    assert isinstance(o_proj, RowParallelLinear) and isinstance(o_proj.inner, LoRALinear)
