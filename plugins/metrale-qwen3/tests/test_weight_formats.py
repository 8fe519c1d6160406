"""Weight formats (``metrale_qwen3.linear``): exact is the default and unchanged; the lossy CPU
formats reproduce what they claim and stay close to exact on the real SmolLM2 (teacher-forced
top-1 agreement and KL against the exact model, on the exact model's greedy continuations)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from metrale_core.components import LoadOptions
from metrale_core.errors import ConfigError
from metrale_core.weights.gguf_dequant import dequantize
from metrale_core.weights.store import RawTensor
import metrale_qwen3.linear as linear_mod
from metrale_qwen3.linear import (SMALL_BATCH_ROWS, WEIGHT_FORMAT_ENV, DenseLinear, Int4Linear,
                                  Int8Linear, _gguf_int4_parts, int4_from_gguf, quantize_int8,
                                  resolve_weight_format)

from qwen3_harness import PagedRunner, load, real_open_weights

GGUF = Path.home() / ".cache" / "metrale" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _raw(weight: np.ndarray, qtype: str) -> RawTensor:
    data = gguf_quants.quantize(weight, GGMLQuantizationType[qtype])
    return RawTensor(data, qtype, tuple(weight.shape))


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_int4_keeps_the_gguf_codes_and_scales(qtype):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((32, 96)).astype(np.float32)
    b = rng.standard_normal((16, 96)).astype(np.float32) * 3
    raws = [_raw(a, qtype), _raw(b, qtype)]
    expected = np.concatenate([dequantize(r.data, qtype, r.shape) for r in raws])
    # the (code, scale, zero) triple is the GGUF value up to float32 rounding of zero = m + 8d
    parts = [_gguf_int4_parts(r) for r in raws]
    planes = 2 if qtype == "Q8_0" else 1  # Q8_0: high- and low-nibble planes side by side
    rebuilt = np.concatenate([((c.reshape(c.shape[0], -1, 32) - 8.0) * d[..., None] + z[..., None])
                              .reshape(c.shape[0], planes, -1).sum(1) for c, d, z in parts])
    np.testing.assert_allclose(rebuilt, expected, rtol=1e-6, atol=1e-6)
    assert all(0 <= c.min() and c.max() <= 15 for c, _, _ in parts)
    lin = int4_from_gguf(raws)
    assert isinstance(lin, Int4Linear) and lin.out_features == 48 and lin.planes == planes
    # the kernel applied to the identity returns the stored matrix (scales kept in bfloat16)
    got = lin(torch.eye(96)).T
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, torch.from_numpy(expected), rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize("rows, kind", [(48, Int4Linear), (40, Int8Linear)])
def test_int8_is_per_channel_symmetric_within_half_a_step(rows, kind):
    w = torch.randn(rows, 64) * torch.linspace(0.1, 5, rows)[:, None]
    lin = quantize_int8(w, bias=torch.ones(rows))
    assert isinstance(lin, kind)  # two 4-bit planes when the packed kernel takes the shape
    step = w.abs().amax(1) / 127
    got = lin(torch.eye(64)).T - 1.0
    assert ((got - w).abs() <= step[:, None] * 0.51 + 1e-2 * w.abs().amax(1, keepdim=True)).all()


@pytest.mark.parametrize("rows_kind", [(48, Int4Linear), (40, Int8Linear)])
def test_quantized_projections_multiply_batches_by_their_bfloat16_copy(rows_kind):
    rows, kind = rows_kind
    torch.manual_seed(0)
    w = torch.randn(rows, 64)
    lin = quantize_int8(w, batch_copy=True)
    assert isinstance(lin, kind) and lin.dense.dtype == torch.bfloat16
    assert torch.equal(lin.dense, w.bfloat16())
    planes = getattr(lin, "planes", 1)
    small = SMALL_BATCH_ROWS // planes  # the largest call that still reads the int8 codes
    x = torch.randn(small + 1, 64)
    by_copy = lin(x)
    torch.testing.assert_close(by_copy, (x.bfloat16() @ w.bfloat16().T).float(), rtol=0, atol=0)
    by_codes = lin(x[:small])
    assert not torch.equal(by_codes, by_copy[:small])  # a different (quantized) matrix ...
    assert (by_codes - by_copy[:small]).abs().max() < 0.02 * by_copy.abs().max()  # ... close to it
    assert quantize_int8(w).dense is None  # without batch_copy every call reads the codes


def test_weight_format_comes_from_options_then_environment(monkeypatch):
    monkeypatch.delenv(WEIGHT_FORMAT_ENV, raising=False)
    assert resolve_weight_format(LoadOptions()) == "exact"
    monkeypatch.setenv(WEIGHT_FORMAT_ENV, "INT4")
    assert resolve_weight_format(None) == "int4"

    class Opts:
        weight_format = "bf16"

    assert resolve_weight_format(Opts()) == "bf16"
    monkeypatch.setenv(WEIGHT_FORMAT_ENV, "int3")
    with pytest.raises(ConfigError, match="int3.*exact, bf16, int8, int4"):
        resolve_weight_format(None)


# --- the real model -------------------------------------------------------------------------

PROMPTS = [[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411,
            407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1,
            520, 9531, 198],
           [6403, 1980, 253, 655],
           [504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30]]
NEW_TOKENS = 16
#: format -> (min teacher-forced top-1 agreement, max mean KL(exact || format)) over all positions.
BOUNDS = {"bf16": (0.95, 0.005), "int8": (0.90, 0.02), "int4": (0.95, 0.005)}

real = pytest.mark.skipif(not GGUF.is_file() or real_open_weights() is None,
                          reason=f"{GGUF} is not downloaded")


def _teacher_forced(model, sequences: list[list[int]], prompt_lens: list[int]) -> list[torch.Tensor]:
    """Log-probs ``[new, V]`` at every continuation position, each sequence in one prefill."""
    runner = PagedRunner(model, num_blocks=64, block_size=16)
    runner.step([(i, seq) for i, seq in enumerate(sequences)])
    return [torch.stack([runner.logits[(i, p)] for p in range(n - 1, len(seq) - 1)]).log_softmax(-1)
            for i, (seq, n) in enumerate(zip(sequences, prompt_lens))]


def _greedy(model, prompt: list[int]) -> list[int]:
    runner = PagedRunner(model, num_blocks=16, block_size=16)
    last = runner.step([(0, prompt)])[0]
    out = []
    for _ in range(NEW_TOKENS):
        out.append(int(last.argmax()))
        last = runner.step([(0, [out[-1]])])[0]
    return prompt + out


@pytest.fixture(scope="module")
def exact_reference():
    torch.set_num_threads(2)
    model = load("llama", real_open_weights()(GGUF))
    assert model.weights.weight_format == "exact" and isinstance(model.weights.head, DenseLinear)
    sequences = [_greedy(model, p) for p in PROMPTS]
    assert sequences[0][len(PROMPTS[0]):len(PROMPTS[0]) + 8] == [504, 3575, 282, 4649, 314, 7042, 30, 2]
    return sequences, _teacher_forced(model, sequences, [len(p) for p in PROMPTS])


@pytest.mark.slow
@real
@pytest.mark.parametrize("fmt, path", [("bf16", "codes"), ("int8", "codes"), ("int8", "batch-copy"),
                                       ("int4", "codes"), ("int4", "batch-copy")])
def test_lossy_formats_stay_close_to_exact_on_smollm2(fmt, path, exact_reference, monkeypatch):
    """Teacher-forced prefill of whole sequences; ``path`` forces every call of a quantized
    projection through its codes (what decode of a few sequences reads) or its bfloat16 copy
    (bf16 has only the one dense path)."""
    monkeypatch.setattr(linear_mod, "SMALL_BATCH_ROWS", 10 ** 9 if path == "codes" else 0)
    monkeypatch.setenv(WEIGHT_FORMAT_ENV, fmt)
    model = load("llama", real_open_weights()(GGUF))
    assert model.weights.weight_format == fmt
    if fmt == "int4":  # the Q4_1 projections and the Q8_0 head keep their GGUF codes
        assert isinstance(model.weights.layers[0].gate_up, Int4Linear)
        assert isinstance(model.weights.head, Int4Linear) and model.weights.head.planes == 2
    sequences, reference = exact_reference
    got = _teacher_forced(model, sequences, [len(p) for p in PROMPTS])
    ref, new = torch.cat(reference), torch.cat(got)
    agreement = (ref.argmax(-1) == new.argmax(-1)).float().mean().item()
    kl = (ref.exp() * (ref - new)).sum(-1).mean().item()
    print(f"\n{fmt} ({path}): teacher-forced top-1 agreement {agreement:.3f}, mean KL {kl:.4f} "
          f"over {ref.shape[0]} positions")
    min_agree, max_kl = BOUNDS[fmt] if path == "codes" else BOUNDS["bf16"]
    assert agreement >= min_agree and kl <= max_kl, (fmt, agreement, kl)
