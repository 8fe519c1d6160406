"""HF MXFP4 experts served as GGUF MXFP4 blocks (``metrale_core.weights.mxfp4_hf``), against
transformers' own dequantizer (``convert_moe_packed_tensors``) on every byte value."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from metrale_core.errors import WeightsError
from metrale_core.weights import ExpertSlices
from metrale_core.weights.gguf_dequant import dequantize
from metrale_core.weights.mxfp4_hf import HfMxfp4Experts, is_hf_mxfp4, to_gguf_blocks
from metrale_core.weights.store import RawSource, RawTensor

E, OUT, G = 3, 6, 4  # experts, output rows (gate/up interleaved), blocks of 32 inputs


class _Store:
    """The few store methods the wrapper reads, over a dict of torch tensors."""

    format = "safetensors"

    def __init__(self, tensors: dict[str, torch.Tensor], files: dict[str, RawSource] | None = None) -> None:
        self.tensors = tensors
        self.config = {"quantization_config": {"quant_method": "mxfp4"}}
        #: name -> its source (None: the raw tensors have none)
        self.files = files or {}

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.tensors[name].shape)

    def quant_type(self, name: str) -> str:
        return "U8"

    def get_raw(self, name: str) -> RawTensor:
        t = self.tensors[name]
        return RawTensor(t, "U8", tuple(t.shape), self.files.get(name))


def _packed(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (E, OUT, G, 16), generator=gen, dtype=torch.uint8)
    blocks[0, 0, 0] = torch.arange(16, dtype=torch.uint8) * 17  # every code, low and high
    scales = torch.randint(100, 150, (E, OUT, G), generator=gen, dtype=torch.uint8)
    return blocks, scales


def test_the_conversion_dequantizes_to_transformers_values_bit_for_bit():
    blocks, scales = _packed()
    ours = dequantize(to_gguf_blocks(blocks.numpy(), scales.numpy()), "MXFP4", (E, OUT, G * 32))
    theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [E, G*32, OUT]
    assert torch.equal(torch.from_numpy(ours), theirs.transpose(1, 2))


def test_expert_slices_are_served_as_mxfp4_rows():
    blocks, scales = _packed(1)
    x = "model.layers.0.mlp.experts.gate_up_proj"
    store = HfMxfp4Experts(ExpertSlices(_Store({f"{x}_blocks": blocks, f"{x}_scales": scales})))
    assert is_hf_mxfp4(store)
    dense = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # transformers' [E, in, out]
    up = f"{x}[2][1::2].T"  # expert 2's up: rows 1, 3, 5 of its [out, in] blocks
    assert up in store and store.quant_type(up) == "MXFP4" and store.shape(up) == (OUT // 2, G * 32)
    assert torch.equal(store.get(up, shape=(OUT // 2, G * 32)), dense[2][:, 1::2].T)
    raw = store.get_raw(up)
    data = np.asarray(raw.data)  # converted when read: views of the HF blocks until then
    assert raw.quant_type == "MXFP4" and data.dtype == np.uint8 and data.shape == (OUT // 2, G * 17)
    assert torch.equal(store.get(f"{x}[1].T"), dense[1].T)
    with pytest.raises(WeightsError, match="transposed"):
        store.get(f"{x}[1]")


def test_a_slice_names_its_source_for_the_repack_cache():
    """A served slice's source is its blocks' file under the slice's name and shape; the scales'
    file joins the name when it is another file; without sources there is none (never cached)."""
    blocks, scales = _packed(2)
    x = "model.layers.0.mlp.experts.down_proj"
    tensors = {f"{x}_blocks": blocks, f"{x}_scales": scales}
    one = RawSource("/m/model.safetensors", 100, 7, f"{x}_blocks", tuple(blocks.shape))
    other = RawSource("/m/model-2.safetensors", 50, 9, f"{x}_scales", tuple(scales.shape))
    name, shape = f"{x}[1].T", (OUT, G * 32)
    assert HfMxfp4Experts(ExpertSlices(_Store(tensors))).get_raw(name).source is None
    same = {f"{x}_blocks": one, f"{x}_scales": one._replace(name=f"{x}_scales")}
    got = HfMxfp4Experts(ExpertSlices(_Store(tensors, same))).get_raw(name).source
    assert got == RawSource("/m/model.safetensors", 100, 7, name, shape)
    split = {f"{x}_blocks": one, f"{x}_scales": other}
    got = HfMxfp4Experts(ExpertSlices(_Store(tensors, split))).get_raw(name).source
    assert got == RawSource("/m/model.safetensors", 100, 7, f"{name}|/m/model-2.safetensors|50|9", shape)
