"""Metrale against llama.cpp on the same GGUF files: an HF checkpoint converted by llama.cpp's own
converter, quantized by its ``llama-quantize``, and both engines' logits compared on every file.

Owner: the llama.cpp oracle tests of the model plugins (issue 31).

Invariants:
- Every file Metrale reads here was written by llama.cpp's tools (``convert_hf_to_gguf.py``, then
  ``llama-quantize``), never by Metrale's code, and is loaded through the registry's loader -- the
  path ``met serve`` takes -- which must be the expected family's.
- Logits are teacher-forced over one sequence, every position (Metrale: one prefill through the
  engine; llama.cpp: ``met-logits``), and compared by :func:`metrale_core.testing.llamacpp.compare`.
- :attr:`OracleRun.quant_error` is llama.cpp's own quantization error: llama.cpp on the quantized
  file against llama.cpp on the unquantized one -- the scale a Metrale-vs-llama.cpp gap is
  judged against.
- :func:`save_tokenizer` writes only real tokenizers or one trained here on fixed text: the
  converter names BPE pre-tokenizers by a hash of what the tokenizer makes of a fixed text and
  refuses one it does not know, so a made-up vocabulary cannot pass.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from metrale_core.testing.llamacpp import compare, convert_hf, llama_logits, quantize
from metrale_core.testing.requires import require_file

__all__ = [
    "DEFAULT_FORMAT",
    "TOKENIZERS",
    "OracleRun",
    "assert_within_llamacpp_quant_error",
    "metrale_logits",
    "run_oracle",
    "save_tokenizer",
    "widen",
]

#: The label of the loader's default weight format (``weight_format=None``).
DEFAULT_FORMAT = "default"
#: The tokenizers :func:`save_tokenizer` writes.
TOKENIZERS = ("smollm2", "smollm2-gpt2", "qwen", "sentencepiece")
_FETCH = "bash scripts/fetch-test-data.sh fetches it"
#: The widened sizes: every matrix row whole Q4_K super-blocks (256 values), so llama-quantize
#: quantizes every tensor to the type asked for instead of a fallback.
WIDTH, FFN, HEADS, HEAD_DIM = 256, 512, 4, 64


def widen(config: dict[str, Any], vocab: int) -> dict[str, Any]:
    """A family test's small HF ``config`` at the widened sizes and a real tokenizer's ``vocab``,
    its branches kept: the same GQA ratio, windows, caps, multipliers and layer pattern; LongRoPE's
    factors resampled to the wider rotary dimension; ``query_pre_attn_scalar`` = head_dim, which
    llama.cpp's Gemma archs assume."""
    c = dict(config)
    ratio = c["num_attention_heads"] // c["num_key_value_heads"]
    c.update(
        vocab_size=vocab,
        hidden_size=WIDTH,
        intermediate_size=FFN,
        num_attention_heads=HEADS,
        num_key_value_heads=max(1, HEADS // ratio),
        head_dim=HEAD_DIM,
        max_position_embeddings=max(c.get("max_position_embeddings", 0), 256),
    )
    for key in ("moe_intermediate_size", "shared_expert_intermediate_size"):
        if key in c:
            c[key] = WIDTH
    if "query_pre_attn_scalar" in c:
        c["query_pre_attn_scalar"] = HEAD_DIM
    rope = c.get("rope_scaling")
    if rope and rope.get("rope_type") == "longrope":
        grid = np.linspace(0.0, 1.0, int(HEAD_DIM * c.get("partial_rotary_factor", 1.0)) // 2)
        factors = ("short_factor", "long_factor")
        c["rope_scaling"] = {
            **rope,
            **{k: np.interp(grid, np.linspace(0, 1, len(rope[k])), rope[k]).tolist() for k in factors},
        }
    return c


def save_tokenizer(kind: str, dest: Path) -> Path:
    """Tokenizer files for a checkpoint, in ``dest`` (returned):

    - ``smollm2``: SmolLM2's BPE, read from the embedded GGUF (the converter's ``smollm``);
    - ``smollm2-gpt2``: the same declared a ``GPT2Tokenizer``, as Phi-4-mini ships (Phi-3's
      converter takes its GPT-2 path only then; transformers gives that class GPT-2's byte level);
    - ``qwen``: the real Qwen3 tokenizer (transformers builds a Qwen2 checkpoint's tokenizer with
      Qwen's own pre-tokenizer whatever the files say, so only Qwen's vocabulary fits there);
    - ``sentencepiece``: a small unigram model trained on fixed text (Gemma 2's converter reads only
      ``tokenizer.model``; it pads the vocabulary to the config's).
    """
    from metrale_core.loading.embedded import GGUF_NAME, cache_dir
    from metrale_core.testing.smollm2 import save_hf_tokenizer

    dest.mkdir(parents=True, exist_ok=True)
    if kind in ("smollm2", "smollm2-gpt2"):
        save_hf_tokenizer(require_file(cache_dir() / "models" / GGUF_NAME, _FETCH), dest)
        if kind == "smollm2-gpt2":
            config_path = dest / "tokenizer_config.json"
            config = json.loads(config_path.read_text())
            config["tokenizer_class"] = "GPT2Tokenizer"
            config_path.write_text(json.dumps(config, indent=2))
    elif kind == "qwen":
        home = Path(os.environ.get("METRALE_QWEN3_TOKENIZER_DIR") or Path.home() / ".cache/metrale/tokenizers/qwen3")
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(require_file(home / name, _FETCH), dest / name)
    elif kind == "sentencepiece":
        import sentencepiece as spm

        from metrale_core.loading.activation_probe import PROBE_TEXT

        model = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter([line for line in PROBE_TEXT.splitlines() if line.strip()]),
            model_writer=model,
            vocab_size=256,
            hard_vocab_limit=False,
            model_type="unigram",
            minloglevel=2,
        )
        (dest / "tokenizer.model").write_bytes(model.getvalue())
    else:
        raise ValueError(f"no tokenizer {kind!r}; one of {TOKENIZERS}")
    return dest


def metrale_logits(path: Path, family: str, ids: list[int], weight_format: str | None) -> np.ndarray:
    """Metrale's float32 logits ``[len(ids), vocab]`` on GGUF ``path``, loaded by the registry's
    loader (which must be ``family``'s) in ``weight_format`` (None: the default)."""
    from metrale_core.loading.activation_probe import all_position_logits
    from metrale_core.plugin.components import LoadOptions
    from metrale_core.plugin.discovery import load_registry
    from metrale_core.weights import open_weights

    store = open_weights(path)
    spec = load_registry().find_model_loader(store.config)
    assert spec.name == family, f"{path.name}: the registry chose {spec.name!r}, not {family!r}"
    model = spec.factory(store, LoadOptions(weight_format=weight_format))
    return all_position_logits(model, ids).numpy()


@dataclass
class OracleRun:
    """The figures of one checkpoint: per GGUF file (``F32``, ``Q8_0``, ``Q4_K_M``), llama.cpp's own
    quantization error and Metrale's gap to llama.cpp per weight format, each (top-1, mean KL)."""

    name: str
    #: the teacher-forced token ids.
    ids: list[int]
    #: file type -> (top-1, KL(llama.cpp on F32 || llama.cpp on this file)).
    quant_error: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: (file type, weight format) -> (top-1, KL(llama.cpp || Metrale)) on the same file.
    gap: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)

    def table(self) -> str:
        """The figures as printed lines (``pytest -s`` shows them)."""
        lines = [f"{self.name}: file, Metrale format -> top-1 / mean KL vs llama.cpp (its own quant error)"]
        for (ftype, fmt), (top1, kl) in self.gap.items():
            q1, qkl = self.quant_error[ftype]
            lines.append(
                f"  {ftype:<7} {fmt:<8} top-1 {top1:.3f}  KL {kl:.2e}   (llama.cpp: top-1 {q1:.3f}, KL {qkl:.2e})"
            )
        return "\n".join(lines)


def run_oracle(
    hf_model: Any,
    family: str,
    tokenizer: Path,
    workdir: Path,
    ids: list[int],
    quants: tuple[str, ...] = ("Q8_0", "Q4_K_M"),
    formats: tuple[str | None, ...] = ("exact", None),
) -> OracleRun:
    """Save ``hf_model`` with the tokenizer files in folder ``tokenizer`` to ``workdir``, convert it
    (F32) and quantize it (``quants``) with llama.cpp's tools, and compare Metrale's logits
    (``formats``; None: the default) with llama.cpp's on every file.  Raises
    :class:`~metrale_core.testing.llamacpp.ConversionRefused` where the converter refuses."""
    checkpoint = workdir / "hf"
    hf_model.save_pretrained(checkpoint)
    for f in tokenizer.iterdir():
        shutil.copy(f, checkpoint / f.name)
    files = {"F32": convert_hf(checkpoint, workdir / "model-f32.gguf", "f32")}
    for q in quants:
        files[q] = quantize(files["F32"], workdir / f"model-{q}.gguf", q)
    run = OracleRun(f"{family} ({type(hf_model).__name__})", list(ids))
    reference = llama_logits(files["F32"], ids)
    for ftype, path in files.items():
        llama = reference if ftype == "F32" else llama_logits(path, ids)
        run.quant_error[ftype] = compare(reference, llama)
        for fmt in formats:
            run.gap[ftype, fmt or DEFAULT_FORMAT] = compare(llama, metrale_logits(path, family, ids, fmt))
    return run


#: The share of llama.cpp's own quantization error (KL) Metrale's gap may take, per file type.  At
#: Q8_0 the weights lose little and llama.cpp also rounds the activations to 8 bits (it multiplies
#: Q8_0 weights with Q8_0-quantized activations), a part of its own error that Metrale's gap then
#: shows: at most the same size.  At Q4_K_M the weights' error dominates, and both engines read the
#: same weights: a tenth.
KL_SHARE = {"F32": 0.0, "Q8_0": 1.0, "Q4_K_M": 0.1}
#: The KL floor: llama.cpp keeps its KV cache in F16 (its default), about 1e-6 nats here.
KL_FLOOR = 1e-5


def assert_within_llamacpp_quant_error(run: OracleRun) -> None:
    """Metrale's gap to llama.cpp on each file is in the class of llama.cpp's own quantization
    error there: a mean KL of at most ``KL_SHARE`` of llama.cpp's own plus ``KL_FLOOR``, and at
    most twice as many top-1 disagreements as llama.cpp has with its own F32 logits, plus one (a
    near-tie of a random model)."""
    for (ftype, fmt), (top1, kl) in run.gap.items():
        q_top1, q_kl = run.quant_error[ftype]
        where = f"{run.name} {ftype} {fmt}"
        bound = KL_SHARE[ftype] * q_kl + KL_FLOOR
        assert kl <= bound, f"{where}: KL {kl:.3g} > {bound:.3g} (llama.cpp's own quantization error {q_kl:.3g})"
        n = len(run.ids)
        wrong, own = round((1 - top1) * n), round((1 - q_top1) * n)
        assert wrong <= 2 * own + 1, f"{where}: {wrong} top-1 disagreements of {n}, llama.cpp's own {own}"
    assert {fmt for _, fmt in run.gap} == {"exact", DEFAULT_FORMAT}, "both weight formats compared"
