"""llama.cpp LoRA adapters (``.gguf``): the oracle is llama.cpp's own converter.

``data/llama_lora.gguf`` and ``data/llama_lora.q8_0.gguf`` are ``data/llama_lora`` (a PEFT adapter
on every projection of a tiny random Llama, r=4, alpha=12) converted by llama.cpp's
``convert_lora_to_gguf.py`` (``data/make_gguf_lora.py`` regenerates all three).  Read back, the
GGUF adapter must be the PEFT adapter (Q/K ``lora_b`` rows un-permuted), and through the engine
it must give PEFT's logits on the same base.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from lora_harness import GGUF_FIXTURE_BASE, RecordingEngine, load_base, random_hf
from transformers import LlamaConfig, LlamaForCausalLM

from metrale_core.api import ConfigError
from metrale_lora.adapter_files import adapter_loader, load_adapter
from metrale_lora.gguf_format import load_gguf_lora
from metrale_lora.peft_format import load_peft

DATA = Path(__file__).resolve().parent / "data"
HEAD_DIM = 16


def test_the_converted_adapter_is_the_peft_adapter():
    peft, gguf = load_peft(DATA / "llama_lora"), load_gguf_lora(DATA / "llama_lora.gguf", HEAD_DIM)
    assert sorted(gguf.modules) == sorted(peft.modules) and len(peft.modules) == 14
    for module, (a, b, scale) in peft.modules.items():
        ga, gb, gscale = gguf.modules[module]
        assert torch.equal(ga, a), module
        assert torch.equal(gb, b), module  # q/k: llama.cpp's row permutation undone
        assert gscale == scale == 12 / 4


def test_a_quantized_adapter_is_dequantized():
    peft = load_peft(DATA / "llama_lora")
    q8 = load_adapter(DATA / "llama_lora.q8_0.gguf", HEAD_DIM)
    for module, (a, b, _) in peft.modules.items():
        qa, qb, _ = q8.modules[module]
        assert torch.allclose(qa, a, atol=0.01 * float(a.abs().max())), module
        assert torch.allclose(qb, b, atol=0.01 * float(b.abs().max())), module


def test_the_engine_gives_pefts_logits_with_the_gguf_adapter(tmp_path):
    from peft import PeftModel

    hf = random_hf(LlamaConfig, LlamaForCausalLM, 7, **GGUF_FIXTURE_BASE)
    hf.save_pretrained(tmp_path / "base")
    reference = PeftModel.from_pretrained(hf, DATA / "llama_lora").eval()
    model = load_base("llama", tmp_path / "base")
    rec = RecordingEngine(model)
    rec.bank.loader = adapter_loader(model)
    rec.bank.load("gguf", str(DATA / "llama_lora.gguf"))
    prompt = [5, 17, 33, 2, 90, 41, 8]
    tokens = rec.run([("g", prompt, "gguf")], max_tokens=4)["g"]
    with torch.no_grad():
        want = reference(torch.tensor([tokens])).logits[0, len(prompt) - 1 : len(tokens) - 1].float()
    got = rec.row_logits("g", tokens, len(prompt))
    assert (got - want).abs().max() < 1e-4


def _write(path: Path, tensors: dict[str, np.ndarray], **kv) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in kv.items():
        if isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_string(key, value)
    for name, value in tensors.items():
        writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


LORA = {"general.type": "adapter", "adapter.type": "lora", "adapter.lora.alpha": 8.0}
A, B = np.ones((2, 64), np.float32), np.ones((64, 2), np.float32)


@pytest.mark.parametrize(
    ("tensors", "kv", "message"),
    [
        (
            {"blk.0.attn_v.weight.lora_a": A, "blk.0.attn_v.weight.lora_b": B},
            {"general.type": "model"},
            "is not a LoRA adapter GGUF",
        ),
        ({"token_embd.weight.lora_a": A, "token_embd.weight.lora_b": B}, LORA, "'token_embd.weight.lora_a'"),
        ({"blk.0.attn_norm.weight": A[0]}, LORA, "is not the lora_a/lora_b of a decoder projection"),
        ({"blk.0.attn_v.weight.lora_a": A}, LORA, "has lora_a but not both"),
        ({"blk.0.attn_v.weight.lora_a": A, "blk.0.attn_v.weight.lora_b": B[:, :1]}, LORA, "do not share a rank"),
    ],
)
def test_what_cannot_be_applied_is_refused_naming_the_file(tmp_path, tensors, kv, message):
    path = _write(tmp_path / "bad.gguf", tensors, **kv)
    with pytest.raises(ConfigError, match=message) as err:
        load_adapter(path, HEAD_DIM)
    assert str(path) in str(err.value)


def test_a_damaged_or_missing_file_is_refused_naming_it(tmp_path):
    bad = tmp_path / "junk.gguf"
    bad.write_bytes(b"not a gguf")
    for path in (bad, tmp_path / "absent.gguf"):
        with pytest.raises(ConfigError, match=str(path)):
            load_adapter(path, HEAD_DIM)


def test_alpha_zero_means_scale_one_and_llama_qk_needs_the_head_size(tmp_path):
    path = _write(
        tmp_path / "a.gguf",
        {"blk.0.attn_q.weight.lora_a": A, "blk.0.attn_q.weight.lora_b": B},
        **{**LORA, "adapter.lora.alpha": 0.0},
    )
    assert load_adapter(path, HEAD_DIM).modules["model.layers.0.self_attn.q_proj"][2] == 1.0
    with pytest.raises(ConfigError, match="Q/K row order"):
        load_adapter(path, None)
