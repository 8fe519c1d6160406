"""gpt-oss from an HF MXFP4 checkpoint (issue 31): experts as ``*_blocks`` / ``*_scales``, as
openai/gpt-oss-20b stores them, vs transformers loading the same directory.

A random small config's experts are quantized to MXFP4 by :func:`pack_mxfp4` (transformers'
quantizer needs triton) into HF's layout -- ``X_blocks`` ``[E, out, G, 16]``, ``X_scales``
``[E, out, G]`` -- and saved with ``quantization_config: {"quant_method": "mxfp4"}``; the packer is
checked by transformers' own dequantizer (``convert_moe_packed_tensors``).  transformers loads the
directory (on CPU it dequantizes the experts) and is the oracle: through the engine, Metrale's
logits are within 1e-4 of it under ``exact`` (whose experts equal transformers' bit for bit) and
within the GGUF test's bound under ``auto``, whose experts stay MXFP4 blocks on the block kernel,
and the greedy tokens equal ``generate``'s.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers as tf
from family_testlib import BASE, NEW_TOKENS, PROMPTS, assert_stored_weights_match_hf, hf_generate, load_family
from qwen3_harness import build_hf, open_store, save_checkpoint
from safetensors.torch import load_file, save_file
from test_gptoss import GGUF_CONFIG, YARN
from transformers.integrations.mxfp4 import FP4_VALUES, convert_moe_packed_tensors

from metrale_core.layers.formats import repack_cache
from metrale_core.layers.formats.gguf_linear import GGUFLinear
from metrale_core.layers.formats.linear_kinds import DenseLinear
from metrale_core.weights import mxfp4_hf

#: The GGUF test's config (whole MXFP4 blocks and kernel tiles), YaRN at its defaults.
CONFIG = {**BASE, **GGUF_CONFIG, "rope_parameters": YARN}


def pack_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` ``[E, out, in]`` -> HF MXFP4 ``blocks`` ``[E, out, in/32, 16]`` and ``scales``
    ``[E, out, in/32]`` (uint8): per block of 32 the E8M0 scale making the largest magnitude at
    most 6, each value rounded to the nearest e2m1 code; code ``2j`` in byte ``j``'s low nibble."""
    E, out, n = w.shape
    g = w.float().reshape(E, out, n // 32, 32)
    amax = g.abs().amax(dim=-1).clamp(min=2.0**-100)
    exp = torch.ceil(torch.log2(amax / 6.0)).to(torch.int32)
    scaled = g / torch.ldexp(torch.ones_like(amax), exp)[..., None]
    lut = torch.tensor(FP4_VALUES)
    codes = (scaled[..., None] - lut).abs().argmin(dim=-1).to(torch.uint8)  # the first of a tie: +0
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks.contiguous(), (exp + 127).to(torch.uint8)


def _checkpoint(tmp_path, seed: int = 7):
    """A random gpt-oss saved as HF MXFP4 (experts as blocks/scales), and transformers' load of it."""
    hf = build_hf(tf.GptOssConfig, tf.GptOssForCausalLM, seed=seed, **CONFIG)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.sinks.copy_(1.5 * torch.randn(layer.self_attn.sinks.shape, generator=gen))
    path = save_checkpoint(hf, tmp_path / "hf")
    tensors = load_file(path / "model.safetensors")
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        w = tensors.pop(name)  # [E, in, out]
        blocks, scales = pack_mxfp4(w.transpose(1, 2))
        deq = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # transformers' own
        assert deq.shape == w.shape and float((deq - w).abs().max()) <= 0.25 * float(w.abs().max())
        tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = blocks, scales
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": None}
    (path / "config.json").write_text(json.dumps(config))
    ref = tf.GptOssForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    return path, ref


def test_exact_experts_are_transformers_dequantized_values(tmp_path):
    path, ref = _checkpoint(tmp_path)
    model = load_family("gpt-oss", open_store(path), "exact")
    for i, layer in enumerate(model.weights.layers):
        experts = ref.model.layers[i].mlp.experts
        for e, expert in enumerate(layer.moe.experts):
            assert isinstance(expert.gate_up, DenseLinear)
            gate_up = torch.cat([experts.gate_up_proj[e, :, 0::2].T, experts.gate_up_proj[e, :, 1::2].T])
            assert torch.equal(expert.gate_up.weight, gate_up)
            assert torch.equal(expert.down.weight, experts.down_proj[e].T)


@pytest.mark.parametrize("weight_format", ["exact", "auto"])
def test_an_hf_mxfp4_checkpoint_matches_transformers(weight_format, tmp_path, monkeypatch):
    torch.set_num_threads(2)
    path, ref = _checkpoint(tmp_path)
    if weight_format == "auto":  # no expert is dequantized: the blocks go to the kernel as they are

        def refuse(*args, **kwargs):
            raise AssertionError("an MXFP4 expert was dequantized under auto")

        monkeypatch.setattr(mxfp4_hf, "dequantize", refuse)
    model = load_family("gpt-oss", open_store(path), weight_format)
    expert = model.weights.layers[1].moe.experts[5]
    blocks = (GGUFLinear,) if weight_format == "auto" else (DenseLinear,)
    assert isinstance(expert.gate_up, blocks) and isinstance(expert.down, blocks)
    outputs = assert_stored_weights_match_hf(ref, model, weight_format, NEW_TOKENS if weight_format == "exact" else 4)
    if weight_format == "exact":
        assert outputs == [hf_generate(ref, p) for p in PROMPTS]


def test_a_second_load_reads_the_repacked_experts_from_the_cache(tmp_path, monkeypatch):
    """Under ``auto`` each expert's MXFP4 blocks are converted and repacked once: the records go
    to the repack cache keyed by the safetensors file, and a second load of the same directory
    reads them back -- no block converted -- the same bits."""
    monkeypatch.setenv(repack_cache.CACHE_ENV, str(tmp_path / "cache"))
    path, _ = _checkpoint(tmp_path)
    converted = []
    convert = mxfp4_hf.to_gguf_blocks
    monkeypatch.setattr(mxfp4_hf, "to_gguf_blocks", lambda b, s: converted.append(b.shape) or convert(b, s))

    def records():
        model = load_family("gpt-oss", open_store(path), "auto")
        projections = [p for layer in model.weights.layers for e in layer.moe.experts for p in (e.gate_up, e.down)]
        assert all(isinstance(p, GGUFLinear) and p.pending for p in projections)  # lazy: nothing read yet
        return [p.repacked().records for p in projections]

    first = records()
    assert len(converted) == 2 * 8 * 3  # per layer and expert: gate, up and down
    assert all(r is not None for r in first) and list((tmp_path / "cache").glob("*/*.bin"))
    converted.clear()
    second = records()
    assert converted == []
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
