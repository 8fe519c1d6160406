"""The LoRA seam of the shared linear layer: declared targets, wrapping, and the batched matmul
against a per-row oracle."""

from __future__ import annotations

import pytest
import torch
from attrs import frozen

from metrale_core.kernels import compile_ptx, nvcc_path, ptx_entries
from metrale_core.layers import DenseLinear, build_linear
from metrale_core.layers.lowrank.lora import LoRAApply, LoRALinear, LoRARows, active_rows, attach_lora
from metrale_core.layers.lowrank.lora_targets import LoRATarget, LoRATargets


class _Store:
    def __init__(self, tensors):
        self.tensors = tensors

    def get(self, name, *, dtype=torch.float32, shape=None):
        t = self.tensors[name]
        assert shape is None or tuple(t.shape) == tuple(shape)
        return t.to(dtype)


@frozen
class _Layer:
    qkv: object
    down: object
    #: ``(path, tensor names, shapes)`` of each declared projection.
    declared: tuple = ()

    def lora_targets(self) -> LoRATargets:
        return LoRATargets(tuple(LoRATarget.of(*d) for d in self.declared))


def _fused(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    tensors = {
        "m.q_proj.weight": torch.randn(8, 6, generator=gen),
        "m.v_proj.weight": torch.randn(4, 6, generator=gen),
        "m.down_proj.weight": torch.randn(6, 5, generator=gen),
    }
    store = _Store(tensors)
    qkv_names, qkv_shapes = ["m.q_proj.weight", "m.v_proj.weight"], [(8, 6), (4, 6)]
    qkv = build_linear(store, qkv_names, qkv_shapes, "exact", torch.float32, "cpu")
    down = build_linear(store, ["m.down_proj.weight"], [(6, 5)], "exact", torch.float32, "cpu")
    declared = ((("qkv",), qkv_names, qkv_shapes), (("down",), ["m.down_proj.weight"], [(6, 5)]))
    return _Layer(qkv, down, declared), tensors


def test_a_target_records_the_fused_parts_and_the_projection_stays_the_base():
    layer, _ = _fused()
    assert isinstance(layer.qkv, DenseLinear)  # build_linear's base object, unchanged
    target = layer.lora_targets().targets[0]
    assert target.path == ("qkv",) and target.dotted == "qkv"
    assert [(p.module, p.offset, p.out_features, p.in_features) for p in target.parts] == [
        ("m.q_proj", 0, 8, 6),
        ("m.v_proj", 8, 4, 6),
    ]
    assert layer.lora_targets().under("model", 0).targets[1].path == ("model", 0, "down")


def _adapter(gen, rank, modules):
    shapes = {"m.q_proj": (8, 6), "m.v_proj": (4, 6), "m.down_proj": (6, 5)}
    return {
        m: (
            torch.randn(rank, shapes[m][1], generator=gen),
            torch.randn(shapes[m][0], rank, generator=gen),
            0.5 * (i + 1),
        )
        for i, m in enumerate(modules)
    }


@pytest.mark.parametrize("path", ["grouped", "batched", "c-kernel"])
def test_wrapped_projection_adds_each_rows_own_adapter(path, monkeypatch):
    """Every CPU path: per adapter group, every slot's rows gathered into two batched products
    (slot 1 holds nothing, so its batch is all padding), and the C kernel (``lora_apply.c``)."""
    import metrale_core.layers.lowrank.lora as lora_module

    if path == "c-kernel":
        assert lora_module.lora_kernel() is not None, "the C kernels build on every x86-64 CPU with AVX2"
    else:
        monkeypatch.setattr(lora_module, "lora_kernel", lambda: None)
    monkeypatch.setattr(lora_module, "BATCHED_MAX_FILL", 2.0 if path == "batched" else 0.0)
    used = []
    batched, native = LoRALinear._batched, LoRALinear._native
    monkeypatch.setattr(LoRALinear, "_batched", lambda self, *a: used.append("batched") or batched(self, *a))
    monkeypatch.setattr(LoRALinear, "_native", lambda self, *a: used.append("c-kernel") or native(self, *a))
    layer, tensors = _fused()
    targets = attach_lora(layer, num_slots=3, max_rank=4, dtype=torch.float32, device="cpu")
    assert set(targets) == {"m.q_proj", "m.v_proj", "m.down_proj"}
    assert isinstance(layer.qkv, LoRALinear) and layer.qkv.bias is None
    assert attach_lora(layer, 3, 4, torch.float32, "cpu").keys() == targets.keys()  # idempotent
    gen = torch.Generator().manual_seed(1)
    adapters = {0: _adapter(gen, 4, ["m.q_proj", "m.v_proj"]), 2: _adapter(gen, 2, ["m.v_proj", "m.down_proj"])}
    for slot, weights in adapters.items():
        layer.qkv.set_slot(slot, weights)
        layer.down.set_slot(slot, weights)
    x = torch.randn(7, 6, generator=gen)
    slots = [-1, 0, 2, 0, -1, 2, 2]  # slot 0 rows are not contiguous
    base = F_linear = x @ torch.cat([tensors["m.q_proj.weight"], tensors["m.v_proj.weight"]]).T
    assert torch.equal(layer.qkv(x), base)  # no active map: exactly the base
    with active_rows(LoRARows.from_slots(slots)):
        y = layer.qkv(x)
    expected = F_linear.clone()
    for t, s in enumerate(slots):
        if s < 0:
            continue
        off = 0
        for module, n in (("m.q_proj", 8), ("m.v_proj", 4)):
            if module in adapters[s]:
                a, b, scale = adapters[s][module]
                expected[t, off : off + n] += scale * (b @ (a @ x[t]))
            off += n
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(y[[0, 4]], base[[0, 4]])  # base rows untouched
    assert set(used) == ({path} if path != "grouped" else set())
    with active_rows(LoRARows.from_slots([-1] * 7)):
        assert torch.equal(layer.qkv(x), base)


def test_rows_from_slots_groups_by_adapter():
    assert LoRARows.from_slots([-1, -1]) is None
    rows = LoRARows.from_slots([1, 1, -1, 0, 1])
    groups = dict(rows.groups)
    assert groups[0] == slice(3, 4) and groups[1].tolist() == [0, 1, 4]
    assert rows.slots.dtype == torch.int32


def test_slot_batches_pad_each_slot_to_the_deepest():
    batches = LoRARows.from_slots([3, -1, 1, 3, 3]).slot_batches()
    assert (batches.first, batches.span, batches.depth) == (1, 3, 3)
    # slot 1: row 2 + 2 padding; slot 2: none, 3 padding; slot 3: rows 0, 3, 4
    assert batches.rows.tolist() == [2, 0, 0, 0, 0, 0, 0, 3, 4]
    assert batches.padding.tolist() == [1, 2, 3, 4, 5]
    assert batches.fill == 9 / 4
    assert LoRARows.from_slots([0, 1]).slot_batches().padding is None


def test_a_row_map_of_another_size_is_an_error():
    layer, _ = _fused()
    attach_lora(layer, 1, 2, torch.float32, "cpu")
    layer.down.set_slot(0, _adapter(torch.Generator().manual_seed(0), 2, ["m.down_proj"]))
    with active_rows(LoRARows.from_slots([0, 0])), pytest.raises(RuntimeError, match="row map"):
        layer.down(torch.randn(3, 5))


def test_native_op_is_the_cpu_path():
    assert LoRAApply("cpu").path == "native"


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH")
def test_lora_kernel_compiles_with_both_entries(tmp_path):
    from metrale_core.kernels import find_cu_files

    cu = next(p for p in find_cu_files("metrale_core.layers") if p.name == "lora.cu")
    entries = set(ptx_entries(compile_ptx(cu, tmp_path, arch="sm_90").read_text()))
    assert {"lora_shrink_f32", "lora_expand_f32"} <= entries


def test_attach_wraps_declared_paths_only_inside_tuples_and_frozen_records():
    """Targets are found by path: a projection in a tuple inside a frozen record deep inside the
    model is wrapped (the tuple rebuilt on its owner); a projection reachable but not declared is
    left alone; two models in one process never see each other's targets."""
    from typing import NamedTuple

    class Pair(NamedTuple):
        first: object
        second: object

    def model():
        layer, _ = _fused()

        class Model:
            def __init__(self):
                self.blocks = [{"inner": (_Layer(layer.qkv, None), Pair(layer.down, layer.down))}]

            def lora_targets(self):
                return LoRATargets(
                    (
                        LoRATarget.of(("blocks", 0, "inner", 0, "qkv"), *layer.declared[0][1:]),
                        LoRATarget.of(("blocks", 0, "inner", 1, 1), *layer.declared[1][1:]),
                    )
                )

        return Model()

    one, two = model(), model()
    inner = one.blocks[0]["inner"]
    targets = attach_lora(one, 1, 2, torch.float32, "cpu")
    assert set(targets) == {"m.q_proj", "m.v_proj", "m.down_proj"}
    wrapped = one.blocks[0]["inner"]
    assert wrapped is not inner and isinstance(wrapped[1], Pair)  # the tuples rebuilt, same types
    assert wrapped[0] is inner[0] and isinstance(wrapped[0].qkv, LoRALinear)  # the record kept, set in place
    assert isinstance(wrapped[1].second, LoRALinear) and isinstance(wrapped[1].first, DenseLinear)
    assert targets["m.down_proj"][0] is wrapped[1].second
    untouched = two.blocks[0]["inner"]
    assert isinstance(untouched[0].qkv, DenseLinear) and isinstance(untouched[1].second, DenseLinear)
    assert set(attach_lora(two, 1, 2, torch.float32, "cpu")) == set(targets)
    assert two.blocks[0]["inner"][0].qkv is not wrapped[0].qkv


def test_a_model_without_targets_is_a_config_error_naming_it():
    from metrale_core.errors import ConfigError

    class Undeclared:
        def __init__(self):
            self.layer, _ = _fused()  # projections reachable, but nothing declared

    with pytest.raises(ConfigError, match="Undeclared declares no LoRA targets"):
        attach_lora(Undeclared(), 1, 2, torch.float32, "cpu")
    layer, _ = _fused()
    bad = _Layer(layer.qkv, layer.down, ((("down",), ["m.q_proj.weight"], [(8, 6)]),))
    with pytest.raises(ValueError, match="at 'down' has 6 outputs, not the 8"):
        attach_lora(bad, 1, 2, torch.float32, "cpu")
    missing = _Layer(layer.qkv, layer.down, ((("up",), ["m.down_proj.weight"], [(6, 5)]),))
    with pytest.raises(LookupError, match="nothing at 'up'"):
        attach_lora(missing, 1, 2, torch.float32, "cpu")


def _gguf_store(tmp_path, tensors):
    """``tensors`` (HF-named, ``blk.0.*`` in the file) quantized to Q8_0 / Q4_0 in a GGUF file."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    from metrale_core.weights.gguf_store import GGUFStore

    path = tmp_path / "lora-base.gguf"
    writer = GGUFWriter(str(path), "qwen3")
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_block_count(1)
    writer.add_context_length(64)
    kinds = {"q_proj": ("attn_q", GGMLQuantizationType.Q8_0), "v_proj": ("attn_v", GGMLQuantizationType.Q4_0)}
    for name, value in tensors.items():
        gguf_name, qtype = kinds[name.split(".")[1]]
        raw = quantize(value.numpy(), qtype)
        writer.add_tensor(f"blk.0.{gguf_name}.weight", raw, raw_shape=raw.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return GGUFStore(path)


@pytest.mark.parametrize("fmt", ["bf16", "int8", "int4", "gguf"])
def test_an_adapter_adds_its_exact_delta_on_every_weight_format(fmt, tmp_path):
    """Whatever the base's weight format, an adapter row is the quantized base's output plus the
    float LoRA delta, and a base row is exactly the quantized base's output."""
    gen = torch.Generator().manual_seed(3)
    tensors = {
        "m.q_proj.weight": 0.1 * torch.randn(32, 64, generator=gen),
        "m.v_proj.weight": 0.1 * torch.randn(16, 64, generator=gen),
    }
    names, shapes = list(tensors), [(32, 64), (16, 64)]
    if fmt == "gguf":
        store = _gguf_store(tmp_path, tensors)
        names = ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.v_proj.weight"]
        fmt = "auto"
    else:
        store = _Store(tensors)
    layer = _Layer(build_linear(store, names, shapes, fmt, torch.float32, "cpu"), None, ((("qkv",), names, shapes),))
    assert not isinstance(layer.qkv, DenseLinear) or fmt == "bf16"
    targets = attach_lora(layer, num_slots=2, max_rank=4, dtype=torch.float32, device="cpu")
    modules = sorted(targets)
    adapter = {
        m: (torch.randn(4, 64, generator=gen), torch.randn(n, 4, generator=gen), 0.25)
        for m, n in zip(modules, (32, 16), strict=True)
    }
    layer.qkv.set_slot(1, adapter)
    x = torch.randn(5, 64, generator=gen)
    base = layer.qkv(x)
    with active_rows(LoRARows.from_slots([1, -1, 1, 1, -1])):
        y = layer.qkv(x)
    delta = torch.cat([scale * (x @ a.T) @ b.T for a, b, scale in (adapter[m] for m in modules)], dim=1)
    torch.testing.assert_close(y[[0, 2, 3]], base[[0, 2, 3]] + delta[[0, 2, 3]], rtol=1e-4, atol=1e-4)
    assert torch.equal(y[[1, 4]], base[[1, 4]])


@pytest.mark.parametrize("mix", ["two-slots", "one-slot"])
def test_the_c_kernel_matches_the_grouped_path_across_row_groups_and_output_tiles(mix):
    """More rows of one slot than the kernel multiplies together (8), outputs over several tiles of
    256, a part the adapter does not target, and rows in any order; two slots with rows (each slot
    on its own thread) and one (the threads share each group's columns and tiles)."""
    import metrale_core.layers.lowrank.lora as lora_module

    assert lora_module.lora_kernel() is not None, "the C kernels build on every x86-64 CPU with AVX2"
    gen = torch.Generator().manual_seed(3)
    shapes = {"m.q_proj": (600, 100), "m.k_proj": (40, 100), "m.v_proj": (40, 100)}
    tensors = {f"{m}.weight": torch.randn(*s, generator=gen) for m, s in shapes.items()}
    qkv = build_linear(
        _Store(tensors), [f"{m}.weight" for m in shapes], list(shapes.values()), "exact", torch.float32, "cpu"
    )
    parts = LoRATarget.of((), [f"{m}.weight" for m in shapes], list(shapes.values())).parts
    wrappers = {path: LoRALinear(qkv, parts, 3, 8, torch.float32, "cpu") for path in ("c", "torch")}
    wrappers["torch"].kernel = None

    def weights(rank, modules, scale):
        return {
            m: (torch.randn(rank, 100, generator=gen), torch.randn(shapes[m][0], rank, generator=gen), scale)
            for m in modules
        }

    adapters = {0: weights(8, list(shapes), 0.5), 2: weights(3, ["m.q_proj", "m.v_proj"], 2.0)}
    for wrapper in wrappers.values():
        for slot, weights in adapters.items():
            wrapper.set_slot(slot, weights)
    slots = [0] * 11 + [-1, 2, 2, -1] + [0] * 3 + [2] * 9
    if mix == "one-slot":
        slots = [-1 if s == 2 else s for s in slots]
    order = torch.randperm(len(slots), generator=gen).tolist()
    slots = [slots[i] for i in order]
    x = torch.randn(len(slots), 100, generator=gen)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # one slot with rows < 2 threads: the shared path
    try:
        with active_rows(LoRARows.from_slots(slots)):
            got, want = wrappers["c"](x), wrappers["torch"](x)
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    base = qkv(x)
    assert torch.equal(got[[i for i, s in enumerate(slots) if s < 0]], base[[i for i, s in enumerate(slots) if s < 0]])
