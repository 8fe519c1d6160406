"""Weight formats (``metrale_core.layers.formats.linear``): exact is the default and unchanged; the lossy CPU
formats reproduce what they claim and stay close to exact on the real SmolLM2 (teacher-forced
top-1 agreement and KL against the exact model, on the exact model's greedy continuations)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants
from qwen3_harness import SMOL_GGUF as GGUF
from qwen3_harness import PagedRunner, load, needs_smol

import metrale_core.layers.formats.linear_kinds as linear_mod
from metrale_core.errors import ConfigError
from metrale_core.kernels import KERNELS_ENV
from metrale_core.kernels.cpu import cpu_flags
from metrale_core.layers.formats import cpu_qmatmul
from metrale_core.layers.formats.linear import WEIGHT_FORMAT_ENV, resolve_weight_format
from metrale_core.layers.formats.linear_kinds import (
    SMALL_BATCH_ROWS,
    Bf16Linear,
    BlockQuantLinear,
    DenseLinear,
    Int4Linear,
    Int8Linear,
    gguf_blocks,
    int4_from_gguf,
    quantize_int8,
)
from metrale_core.plugin.components import LoadOptions
from metrale_core.testing.requires import cpu_isa_params, use_cpu_isa
from metrale_core.testing.smollm2 import CAPITAL_CHAT_IDS
from metrale_core.weights import open_weights
from metrale_core.weights.gguf_dequant import dequantize
from metrale_core.weights.store import RawTensor


def _raw(weight: np.ndarray, qtype: str) -> RawTensor:
    data = gguf_quants.quantize(weight, GGMLQuantizationType[qtype])
    return RawTensor(data, qtype, tuple(weight.shape))


def _c_kernel(monkeypatch, isa: str):
    """The matmul's C library in variant ``isa`` (skip, or fail under CI=true, where it cannot run)."""
    use_cpu_isa(monkeypatch, isa, cpu_qmatmul.PACKAGE)
    lib = cpu_qmatmul.kernel()
    if lib is None:
        pytest.skip("METRALE_KERNELS=native")
    return lib


@pytest.fixture(params=[*(f"c-{isa}" for isa in cpu_isa_params()), "torch-int4"])
def kernel_path(request, monkeypatch):
    """Run a test on the C kernel of each variant the CPU runs and on torch's int4 fallback."""
    if request.param.startswith("c-"):
        _c_kernel(monkeypatch, request.param.removeprefix("c-"))
        return BlockQuantLinear
    monkeypatch.setattr(cpu_qmatmul, "kernel", lambda: None)
    return Int4Linear


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_quantized_projections_keep_the_gguf_codes_and_scales(qtype, kernel_path):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((32, 96)).astype(np.float32)
    b = rng.standard_normal((16, 96)).astype(np.float32) * 3
    raws = [_raw(a, qtype), _raw(b, qtype)]
    expected = np.concatenate([dequantize(r.data, qtype, r.shape) for r in raws])
    # (codes, d, m) rebuild the GGUF values exactly
    parts = [gguf_blocks(r) for r in raws]
    rebuilt = np.concatenate(
        [(c.reshape(c.shape[0], -1, 32) * d[..., None] + m[..., None]).reshape(c.shape) for c, d, m, _ in parts]
    )
    np.testing.assert_array_equal(rebuilt, expected)
    bits = 8 if qtype == "Q8_0" else 4
    assert all(b_ == bits and c.min() >= 0 and c.max() < 2**bits for c, _, _, b_ in parts)
    lin = int4_from_gguf(raws)
    assert isinstance(lin, kernel_path) and lin.out_features == 48
    # the kernel applied to the identity returns the stored matrix: the VNNI kernel quantizes a
    # one-hot block without loss; torch's kernel rounds scales and zeros to bfloat16
    got = lin(torch.eye(96)).T
    assert got.dtype == torch.float32
    tol = 1e-6 if kernel_path is BlockQuantLinear else 2e-2
    torch.testing.assert_close(got, torch.from_numpy(expected), rtol=tol, atol=tol)


HAS_AMX = {"amx_tile", "amx_int8"} <= cpu_flags()


def _matmul_paths() -> list[str]:
    isas = cpu_isa_params()
    return [
        *(["avx512-vnni", "avx512-amx"] if "avx512" in isas else []),
        *(["avx2"] if "avx2" in isas else []),
        *(["none"] if isas == ["none"] else []),
    ]


@pytest.fixture(params=_matmul_paths())
def matmul_path(request, monkeypatch):
    """The kernel of each variant the CPU runs; the AVX512 one with AMX off (AVX512-VNNI only) or
    on (calls of AMX_MIN_ROWS rows or more)."""
    isa, _, sub = request.param.partition("-")
    lib = _c_kernel(monkeypatch, isa)
    if sub == "amx" and not HAS_AMX:
        pytest.skip("the CPU has no AMX-INT8")
    assert cpu_qmatmul.set_amx(lib, sub == "amx") == (sub == "amx")
    yield lib
    cpu_qmatmul.set_amx(lib, True)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 12, 16, 17, 40])
def test_quantized_matmul_matches_its_reference(bits, rows, matmul_path):
    """Every row-group size, AMX row tile and padding, both code widths and both paths against the
    same maths in float64 torch ops (the activation codes are bit-exact, so only sums differ)."""
    rng = np.random.default_rng(rows)
    n, k = 64, 160
    codes = rng.integers(0, 2**bits, (n, k))
    d = (rng.random((n, k // 32)) * 0.02).astype(np.float32)
    m = (-rng.random((n, k // 32)) * 0.1).astype(np.float32)
    x = torch.randn(rows, k) * torch.linspace(0.01, 10, k)  # blocks of very different ranges
    got = cpu_qmatmul.qmatmul(matmul_path, x, cpu_qmatmul.pack(codes, d, m, bits), n, bits)
    want = cpu_qmatmul.reference(x, torch.from_numpy(codes), torch.from_numpy(d), torch.from_numpy(m))
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    # ... and the reference is close to the float matmul it approximates
    w = (
        torch.from_numpy(codes).reshape(n, -1, 32) * torch.from_numpy(d).half().float()[..., None]
        + torch.from_numpy(m).half().float()[..., None]
    ).reshape(n, k)
    exact = x.double() @ w.double().T
    assert (want - exact).abs().max() < 0.02 * exact.abs().max()


def test_zero_rows_are_an_empty_product(matmul_path):
    """A step with no row for a projection (no logits row in a prefill chunk): the C entry point
    takes R = 0 and returns an empty result (a negative R is still refused)."""
    codes, d = np.zeros((32, 64)), np.ones((32, 2), np.float32) * 0.01
    packed = cpu_qmatmul.pack(codes, d, np.zeros_like(d), 4)
    assert cpu_qmatmul.qmatmul(matmul_path, torch.empty(0, 64), packed, 32, 4).shape == (0, 32)
    assert matmul_path.mq_linear(0, -1, 64, packed.data_ptr(), 32, 4, 0, 0, 1) == -1
    # (the bfloat16 matmul's: tests/layers/formats/test_cpu_qmatmul.py)


def test_pack_rejects_what_the_kernel_cannot_take():
    with pytest.raises(ValueError, match="N % 16"):
        cpu_qmatmul.pack(np.zeros((8, 32)), np.ones((8, 1)), np.zeros((8, 1)), 4)
    with pytest.raises(ValueError, match=r"codes outside 0..15"):
        cpu_qmatmul.pack(np.full((16, 32), 16), np.ones((16, 1)), np.zeros((16, 1)), 4)
    with pytest.raises(ValueError, match="fp16"):
        cpu_qmatmul.pack(np.zeros((16, 32)), np.full((16, 1), 1e6), np.zeros((16, 1)), 8)


def test_native_kernels_turn_the_vnni_matmul_off(monkeypatch):
    monkeypatch.setenv(KERNELS_ENV, "native")
    assert cpu_qmatmul.kernel() is None
    assert isinstance(quantize_int8(torch.randn(16, 64)), Int4Linear)


@pytest.mark.parametrize("rows", [48, 40])
def test_int8_is_symmetric_per_block_within_half_a_step(rows, kernel_path):
    torch.manual_seed(0)
    w = torch.randn(rows, 64) * torch.linspace(0.1, 5, rows)[:, None]
    w[:, 32:] *= 0.01  # the second block of each row is far smaller: per-block scales keep it
    lin = quantize_int8(w, bias=torch.ones(rows))
    kind = Int8Linear if rows % 16 else kernel_path  # not whole tiles: one scale per row
    assert isinstance(lin, kind)
    blocks = w.reshape(rows, 2, 32).abs().amax(-1, keepdim=True).expand(rows, 2, 32).reshape(rows, 64)
    step = (w.abs().amax(1, keepdim=True) if kind is Int8Linear else blocks) / 127
    got = lin(torch.eye(64)).T - 1.0
    slack = 1e-5 if kind is BlockQuantLinear else 1e-2 * w.abs().amax(1, keepdim=True)  # bf16 scales
    assert ((got - w).abs() <= step * 0.51 + slack).all()
    if kind is not Int8Linear:  # the small block is resolved to its own step, not the row's
        assert ((got - w)[:, 32:].abs() <= w[:, 32:].abs().amax(1, keepdim=True) / 127 * 0.51 + slack).all()


@pytest.mark.parametrize("k", [24, 40, 100])
def test_int8_rows_of_any_width_and_row_count(k):
    """K that is not a multiple of 16: torch's int8pack kernel segfaulted on AVX512-BF16 CPUs for
    such K (bfloat16 inputs, 2+ rows) until the codes were padded; every row count now runs and
    matches the dequantized matrix."""
    torch.manual_seed(0)
    w = torch.randn(24, k)
    lin = quantize_int8(w)
    assert isinstance(lin, Int8Linear) and lin.qweight.shape == (24, -(-k // 16) * 16)
    deq = lin.qweight[:, :k].float() * lin.scales.float()[:, None]
    for rows in (1, 2, 3, 4, 5, 16, 17):
        x = torch.randn(rows, k)
        ref = x.bfloat16().float() @ deq.T
        assert (lin(x) - ref).abs().max() <= 0.02 * ref.abs().max()


@pytest.mark.parametrize("rows", [48, 40])
def test_quantized_projections_multiply_batches_by_their_bfloat16_copy(rows, kernel_path):
    torch.manual_seed(0)
    w = torch.randn(rows, 64)
    lin = quantize_int8(w, batch_copy=True)
    kind = Int8Linear if rows % 16 else kernel_path
    assert isinstance(lin, kind)
    # the C kernel's bfloat16 matmul (float32 products, batch-invariant) where it runs and takes
    # the shape, else torch's bfloat16 matmul of the bfloat16 copy
    invariant = kind is BlockQuantLinear
    assert isinstance(lin.batch, Bf16Linear if invariant else DenseLinear)
    if not invariant:
        assert torch.equal(lin.batch.weight, w.bfloat16())
    # the largest call that still reads the int8 codes
    small = (
        linear_mod.BLOCK_QUANT_BATCH_ROWS if kind is BlockQuantLinear else SMALL_BATCH_ROWS // getattr(lin, "planes", 1)
    )
    x = torch.randn(small + 1, 64)
    by_copy = lin(x)
    if invariant:
        want = cpu_qmatmul.qmatmul_bf16(lin.batch.kernel, x, cpu_qmatmul.pack_bf16(w), rows)
    else:
        want = (x.bfloat16() @ w.bfloat16().T).float()
    torch.testing.assert_close(by_copy, want, rtol=0, atol=0)
    by_codes = lin(x[:small])
    assert not torch.equal(by_codes, by_copy[:small])  # a different (quantized) matrix ...
    assert (by_codes - by_copy[:small]).abs().max() < 0.02 * by_copy.abs().max()  # ... close to it
    assert quantize_int8(w).batch is None  # without batch_copy every call reads the codes


def test_weight_format_comes_from_options_then_environment(monkeypatch):
    monkeypatch.delenv(WEIGHT_FORMAT_ENV, raising=False)
    assert resolve_weight_format(LoadOptions()) == "auto"
    monkeypatch.setenv(WEIGHT_FORMAT_ENV, "INT4")
    assert resolve_weight_format(None) == "int4"

    class Opts:
        weight_format = "bf16"

    assert resolve_weight_format(Opts()) == "bf16"
    monkeypatch.setenv(WEIGHT_FORMAT_ENV, "int3")
    with pytest.raises(ConfigError, match=r"int3.*auto, exact, bf16, int8, int4"):
        resolve_weight_format(None)


# --- the real model -------------------------------------------------------------------------

PROMPTS = [
    list(CAPITAL_CHAT_IDS),
    [6403, 1980, 253, 655],
    [504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30],
]
NEW_TOKENS = 16
#: format -> (min teacher-forced top-1 agreement, max mean KL(exact || format)) over all positions.
#: The VNNI kernel quantizes activations per block of 32 to int8, as llama.cpp does: measured
#: 0.958-0.979 / KL 0.003-0.0037 for int4 here, and llama.cpp itself (llama-cpp-python 0.3.36, same
#: GGUF and sequences) scores 0.979 / KL 0.0029 against the exact model.
#: auto multiplies the GGUF's own blocks with 15-bit activations (gguf_linear): near exact.
BOUNDS = {"bf16": (0.95, 0.005), "int8": (0.90, 0.02), "int4": (0.93, 0.006), "auto": (0.99, 0.0005)}

real = needs_smol


def _teacher_forced(model, sequences: list[list[int]], prompt_lens: list[int]) -> list[torch.Tensor]:
    """Log-probs ``[new, V]`` at every continuation position, each sequence in one prefill."""
    runner = PagedRunner(model, num_blocks=64, block_size=16)
    runner.step([(i, seq) for i, seq in enumerate(sequences)])
    return [
        torch.stack([runner.logits[(i, p)] for p in range(n - 1, len(seq) - 1)]).log_softmax(-1)
        for i, (seq, n) in enumerate(zip(sequences, prompt_lens))
    ]


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
    model = load("llama", open_weights(GGUF))
    assert model.weights.weight_format == "exact" and isinstance(model.weights.head, DenseLinear)
    sequences = [_greedy(model, p) for p in PROMPTS]
    assert sequences[0][len(PROMPTS[0]) : len(PROMPTS[0]) + 8] == [504, 3575, 282, 4649, 314, 7042, 30, 2]
    return sequences, _teacher_forced(model, sequences, [len(p) for p in PROMPTS])


@pytest.mark.slow
@real
@pytest.mark.parametrize(
    "fmt, path",
    [
        ("bf16", "codes"),
        ("int8", "codes"),
        ("int8", "batch-copy"),
        ("int4", "codes"),
        ("int4", "batch-copy"),
        ("auto", "codes"),
    ],
)
def test_lossy_formats_stay_close_to_exact_on_smollm2(fmt, path, exact_reference, monkeypatch):
    """Teacher-forced prefill of whole sequences; ``path`` forces every call of a quantized
    projection through its codes (what decode of a few sequences reads) or its bfloat16 copy
    (bf16 has only the one dense path)."""
    for knob in ("SMALL_BATCH_ROWS", "BLOCK_QUANT_BATCH_ROWS"):
        monkeypatch.setattr(linear_mod, knob, 10**9 if path == "codes" else 0)
    monkeypatch.setenv(WEIGHT_FORMAT_ENV, fmt)
    model = load("llama", open_weights(GGUF), weight_format=None)
    assert model.weights.weight_format == fmt
    if fmt == "bf16":  # float32 logits: the C kernel where it runs, else torch's
        head = model.weights.head
        if cpu_qmatmul.bf16_kernel() is not None:
            assert isinstance(head, Bf16Linear) and isinstance(model.weights.layers[0].gate_up, Bf16Linear)
        else:
            assert head.weight.dtype == torch.float32
            assert torch.equal(head.weight, head.weight.to(torch.bfloat16).float())
    if fmt == "int4":  # the Q4_1 projections and the Q8_0 head keep their GGUF codes
        kind = BlockQuantLinear if cpu_qmatmul.kernel() is not None else Int4Linear
        assert isinstance(model.weights.layers[0].gate_up, kind) and isinstance(model.weights.head, kind)
    sequences, reference = exact_reference
    got = _teacher_forced(model, sequences, [len(p) for p in PROMPTS])
    ref, new = torch.cat(reference), torch.cat(got)
    agreement = (ref.argmax(-1) == new.argmax(-1)).float().mean().item()
    kl = (ref.exp() * (ref - new)).sum(-1).mean().item()
    print(
        f"\n{fmt} ({path}): teacher-forced top-1 agreement {agreement:.3f}, mean KL {kl:.4f} "
        f"over {ref.shape[0]} positions"
    )
    min_agree, max_kl = BOUNDS[fmt] if path == "codes" else BOUNDS["bf16"]
    assert agreement >= min_agree and kl <= max_kl, (fmt, agreement, kl)
