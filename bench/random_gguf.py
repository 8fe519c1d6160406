"""Random-weight GGUFs of real model shapes, in llama.cpp's Q4_K_M mix, for speed benchmarks.

Owner: ``bench/bench_families.py`` (and anyone who needs a multi-GB model that no hub serves).  A
shape from :data:`SHAPES` is written under llama.cpp's tensor names and metadata keys, with the
tokenizer of a real GGUF copied in (Qwen2.5-Coder-0.5B's by default: a 151,936-token BPE that
every arch here accepts, so every file costs the same output head).

Invariants:
- The quantization mix is ``llama-quantize``'s Q4_K_M: Q4_K everywhere, Q6_K for ``output`` and
  for ``attn_v`` / ``ffn_down`` (and the experts' ``ffn_down_exps``) in the layers its
  ``use_more_bits`` picks; norms and the MoE router in F32.
- Block bytes are random, with the scales fixed small and normal (no NaN, no subnormal), so the
  weights are of the size trained ones have; the values mean nothing -- speed, not text, is measured.
- Tensors stream to disk one at a time (``GGUFWriter``'s tensor-info mode): a 17 GB file needs no
  17 GB of memory.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

Q4_K, Q6_K, F32 = GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K, GGMLQuantizationType.F32
_BLOCK = 256
_BYTES = {Q4_K: 144, Q6_K: 210}


@dataclass(frozen=True)
class Shape:
    """One model's dimensions under a GGUF arch (``experts`` > 0: an MoE with ``expert_ffn`` wide
    experts, ``used`` of them per token)."""

    arch: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    context: int = 4096
    experts: int = 0
    used: int = 0
    expert_ffn: int = 0
    tied: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


#: Real shapes (the model each one copies in the comment).
SHAPES = {
    "qwen3moe-30b-a3b": Shape("qwen3moe", 2048, 48, 32, 4, 128, 6144, experts=128, used=8, expert_ffn=768),
    "phi3-4b": Shape("phi3", 3072, 32, 24, 8, 128, 8192),  # Phi-4-mini-instruct
    "gemma2-2b": Shape(
        "gemma2",
        2304,
        26,
        8,
        4,
        256,
        9216,
        tied=True,
        extra={"attention.sliding_window": 4096, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
    ),
    "smollm3-3b": Shape("smollm3", 2048, 36, 16, 4, 128, 11008),  # SmolLM3-3B
    "granite-2b": Shape(
        "granite",
        2048,
        40,
        32,
        8,
        64,
        8192,
        extra={"embedding_scale": 12.0, "residual_scale": 0.22, "attention.scale": 0.015625, "logit_scale": 8.0},
    ),  # granite-3.3-2b
    "olmo2-1b": Shape("olmo2", 2048, 16, 16, 16, 128, 8192),  # OLMo-2-0425-1B
    "mistral-3b": Shape("llama", 3072, 28, 24, 8, 128, 8192),  # a Llama-3.2-3B-shaped Mistral (explicit head_dim)
}


def _use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's ``use_more_bits``: the layers whose attn_v / ffn_down Q4_K_M keeps in Q6_K."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def _tensors(s: Shape) -> Iterator[tuple[str, tuple[int, ...], GGMLQuantizationType]]:
    """(name, numpy shape (rows last), type) of every tensor, in file order."""
    vocab = s.extra.get("vocab", 151936)
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    yield "token_embd.weight", (vocab, s.hidden), Q4_K
    for i in range(s.layers):
        more = _use_more_bits(i, s.layers)
        b = f"blk.{i}."
        if s.arch != "olmo2":
            yield b + "attn_norm.weight", (s.hidden,), F32
        if s.arch == "phi3":
            yield b + "attn_qkv.weight", (q + 2 * kv, s.hidden), Q4_K
        else:
            yield b + "attn_q.weight", (q, s.hidden), Q4_K
            yield b + "attn_k.weight", (kv, s.hidden), Q4_K
            yield b + "attn_v.weight", (kv, s.hidden), Q6_K if more else Q4_K
        if s.arch in ("qwen3", "qwen3moe"):
            yield b + "attn_q_norm.weight", (s.head_dim,), F32
            yield b + "attn_k_norm.weight", (s.head_dim,), F32
        if s.arch == "olmo2":
            yield b + "attn_q_norm.weight", (q,), F32
            yield b + "attn_k_norm.weight", (kv,), F32
        yield b + "attn_output.weight", (s.hidden, q), Q4_K
        if s.arch in ("gemma2", "olmo2"):
            yield b + "post_attention_norm.weight", (s.hidden,), F32
        if s.arch != "olmo2":
            yield b + "ffn_norm.weight", (s.hidden,), F32
        if s.experts:
            yield b + "ffn_gate_inp.weight", (s.experts, s.hidden), F32
            yield b + "ffn_gate_exps.weight", (s.experts, s.expert_ffn, s.hidden), Q4_K
            yield b + "ffn_up_exps.weight", (s.experts, s.expert_ffn, s.hidden), Q4_K
            yield b + "ffn_down_exps.weight", (s.experts, s.hidden, s.expert_ffn), Q6_K if more else Q4_K
        elif s.arch == "phi3":
            yield b + "ffn_up.weight", (2 * s.ffn, s.hidden), Q4_K
            yield b + "ffn_down.weight", (s.hidden, s.ffn), Q6_K if more else Q4_K
        else:
            yield b + "ffn_gate.weight", (s.ffn, s.hidden), Q4_K
            yield b + "ffn_up.weight", (s.ffn, s.hidden), Q4_K
            yield b + "ffn_down.weight", (s.hidden, s.ffn), Q6_K if more else Q4_K
        if s.arch in ("gemma2", "olmo2"):
            yield b + "post_ffw_norm.weight", (s.hidden,), F32
    yield "output_norm.weight", (s.hidden,), F32
    if not s.tied:
        yield "output.weight", (vocab, s.hidden), Q6_K


def _bytes_shape(shape: tuple[int, ...], kind: GGMLQuantizationType) -> tuple[int, ...]:
    *outer, cols = shape
    assert cols % _BLOCK == 0, f"a row of {cols} is not whole {_BLOCK}-blocks"
    return (*outer, cols // _BLOCK * _BYTES[kind])


def _random(shape: tuple[int, ...], kind: GGMLQuantizationType, name: str, rng: np.random.Generator) -> np.ndarray:
    if kind == F32:
        if name.endswith("ffn_gate_inp.weight"):
            return rng.normal(0.0, 0.02, size=shape).astype(np.float32)
        return np.ones(shape, dtype=np.float32)
    raw = rng.integers(0, 256, size=_bytes_shape(shape, kind), dtype=np.uint8)
    blocks = raw.reshape(-1, _BYTES[kind])
    if kind == Q4_K:  # d, dmin (f16) first: 1e-4 each
        blocks[:, 0:4] = np.array([1e-4, 1e-4], dtype=np.float16).view(np.uint8)
    else:  # Q6_K: int8 scales in [-8, 8), d (f16) last: 1e-3
        blocks[:, 192:208] = rng.integers(-8, 8, size=(blocks.shape[0], 16), dtype=np.int8).view(np.uint8)
        blocks[:, 208:210] = np.array([1e-3], dtype=np.float16).view(np.uint8)
    return raw


def _copy_tokenizer(w: GGUFWriter, source: Path) -> int:
    """Copy every ``tokenizer.*`` key of ``source`` into ``w``; returns the vocabulary size."""
    reader = GGUFReader(str(source))
    vocab = 0
    for key, f in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        main = f.types[0]
        if main == GGUFValueType.ARRAY:
            values = f.contents()
            sub = f.types[1]
            w.add_key_value(key, values, GGUFValueType.ARRAY, sub_type=sub)
            if key == "tokenizer.ggml.tokens":
                vocab = len(values)
        else:
            w.add_key_value(key, f.contents(), main)
    return vocab


def write(shape: Shape, path: Path, tokenizer: Path, seed: int = 0) -> Path:
    """Write ``shape`` to ``path`` (skipped when a complete file is there already)."""
    done = path.with_suffix(path.suffix + ".done")
    if path.exists() and done.exists():
        return path
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), shape.arch)
    a = shape.arch
    w.add_name(f"random {a}")
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_rope_freq_base(1e6 if a.startswith("qwen") else 10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(15)  # MOSTLY_Q4_K_M
    if shape.experts:
        w.add_expert_count(shape.experts)
        w.add_expert_used_count(shape.used)
        w.add_expert_feed_forward_length(shape.expert_ffn)
    for key, value in shape.extra.items():
        if key != "vocab":
            w.add_key_value(
                f"{a}.{key}", value, GGUFValueType.FLOAT32 if isinstance(value, float) else GGUFValueType.UINT32
            )
    vocab = _copy_tokenizer(w, tokenizer)
    shape = Shape(**{**shape.__dict__, "extra": {**shape.extra, "vocab": vocab}})
    layout = list(_tensors(shape))
    for name, dims, kind in layout:
        if kind == F32:
            w.add_tensor_info(name, dims, np.dtype(np.float32), int(np.prod(dims)) * 4)
        else:
            byte_shape = _bytes_shape(dims, kind)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, dims, kind in layout:
        w.write_tensor_data(_random(dims, kind, name, rng))
    w.close()
    done.touch()
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than the real shape")
    ap.add_argument("--tokenizer", type=Path, default=None, help="a GGUF whose tokenizer is copied")
    args = ap.parse_args()
    from metrale_core.testing.chunked_weights import model_by_name

    shape = SHAPES[args.shape]
    if args.layers:
        shape = Shape(**{**shape.__dict__, "layers": args.layers})
    print(write(shape, args.out, args.tokenizer or model_by_name("qwen")))


if __name__ == "__main__":
    main()
