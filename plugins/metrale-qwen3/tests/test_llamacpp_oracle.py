"""The llama.cpp oracle (issue 31): random HF checkpoints of every family this plugin serves,
converted by llama.cpp's own ``convert_hf_to_gguf.py`` and quantized by its ``llama-quantize`` to
Q8_0 and Q4_K_M; Metrale's logits on each file (the registry's loader, ``exact`` and the default
weight format) against llama.cpp's on the same file.

The checkpoints are the family tests' configs (one per family: windows, soft-caps, NoPE layers,
multipliers, LongRoPE, biases, shared experts), widened so that every matrix row is whole Q4_K
super-blocks (``llamacpp_oracle.widen``) and saved with a tokenizer the converter accepts (it
names BPE pre-tokenizers by a hash and refuses a made-up one): SmolLM2's real one, Qwen's for
Qwen2 (transformers builds a Qwen2 tokenizer with Qwen's pre-tokenizer whatever the files say),
SmolLM2's declared a ``GPT2Tokenizer`` for Phi-3 (Phi-4-mini's way), and a small SentencePiece
model for Gemma 2 (its converter reads only ``tokenizer.model``).  What llama.cpp 0.3.36 cannot
convert is held by a test of the converter's own error: a Qwen3-MoE with dense layers.  The
prompt is 32 real token ids, teacher-forced; the figures are top-1 agreement and mean KL in nats,
and ``pytest -s`` prints them.

The bar is llama.cpp's own quantization error (llama.cpp on the quantized file against llama.cpp
on the F32 one; ``llamacpp_oracle.assert_within_llamacpp_quant_error``): Metrale's mean KL to
llama.cpp at most that error at Q8_0 (where llama.cpp also rounds the activations to 8 bits,
which Metrale's exact path does not), a tenth of it at Q4_K_M, plus 1e-5 (llama.cpp's F16 KV
cache; the F32 file agrees to ~1e-6), and at most twice llama.cpp's own top-1 disagreements
plus one.  Measured here: F32 KL ~1e-6; Q8_0 about 0.3-0.9 of llama.cpp's own; Q4_K_M about
0.01 of it.  The cases where the two engines differ are strict xfails with the reason
(``DIFFERENT``).  The tools come from ``scripts/build-llamacpp.sh`` (``$METRALE_LLAMACPP_BIN``);
without them the tests skip locally and fail under ``CI=true``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers as tf
from qwen3_harness import build_hf, needs_smol
from test_dense_families import FAMILIES as DENSE
from test_llama_parity import CASES as LLAMA_QWEN2
from test_moe_families import FAMILIES as MOE
from test_olmo2 import CONFIGS as OLMO2
from test_qwen3_parity import CONFIGS as QWEN3

from metrale_core.testing.llamacpp import ConversionRefused, tool
from metrale_core.testing.llamacpp_oracle import assert_within_llamacpp_quant_error, run_oracle, save_tokenizer, widen
from metrale_core.testing.smollm2 import CAPITAL_CHAT_IDS, VOCAB_SIZE

pytestmark = [pytest.mark.slow, needs_smol]

#: 32 real SmolLM2 token ids (a rendered chat), valid in every vocabulary used here.
IDS = list(CAPITAL_CHAT_IDS[:32])
#: SmolLM2's <|im_start|> / <|im_end|> (Qwen's ids there are ordinary tokens: only ids matter here).
SPECIAL_IDS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=2)
#: tokenizer (``save_tokenizer``'s kinds) -> the vocabulary size of a checkpoint saved with it.
VOCABS = {"smollm2": VOCAB_SIZE, "smollm2-gpt2": VOCAB_SIZE, "qwen": 151669, "sentencepiece": VOCAB_SIZE}
#: case -> (the loader that must read the GGUF, config class, model class, the family test's
#: config, tokenizer, overrides).
CASES = {
    "llama": ("llama", tf.LlamaConfig, tf.LlamaForCausalLM, LLAMA_QWEN2["llama-tied-biases"][3], "smollm2", {}),
    "qwen2": ("qwen2", tf.Qwen2Config, tf.Qwen2ForCausalLM, LLAMA_QWEN2["qwen2-qkv-bias"][3], "qwen", {}),
    # (llama.cpp's qwen3 has no attention biases: a file with them fails its loader's tensor count)
    "qwen3": ("qwen3", tf.Qwen3Config, tf.Qwen3ForCausalLM, QWEN3["gqa4-one-kv-head"], "smollm2", {}),
    "olmo2": ("olmo2", tf.Olmo2Config, tf.Olmo2ForCausalLM, OLMO2["gqa2-untied"], "smollm2", {}),
    # llama.cpp converts Mistral to its "llama" arch (no sliding window there: both engines read
    # the same file, so both attend to the whole prompt)
    "mistral": ("llama", *DENSE["mistral"][:2], DENSE["mistral"][2]["window-gqa-headdim"], "smollm2", {}),
    "granite": ("granite", *DENSE["granite"][:2], DENSE["granite"][2]["gqa-untied"], "smollm2", {}),
    "smollm3": ("smollm3", *DENSE["smollm3"][:2], DENSE["smollm3"][2]["nope-every-4"], "smollm2", {}),
    "gemma2": ("gemma2", *DENSE["gemma2"][:2], DENSE["gemma2"][2]["softcaps-window-untied"], "sentencepiece", {}),
    # the prompt within LongRoPE's original length and llama.cpp's context (256) not past it: the
    # short factors everywhere, in all three (see the xfail case below for past it)
    "phi3": (
        "phi3",
        *DENSE["phi3"][:2],
        DENSE["phi3"][2]["longrope-gqa"],
        "smollm2-gpt2",
        {"original_max_position_embeddings": 256, "max_position_embeddings": 1024},
    ),
    "qwen2moe": ("qwen2moe", *MOE["qwen2moe"][:2], MOE["qwen2moe"][2]["shared-gated-no-renorm"], "smollm2", {}),
    # llama3 RoPE scaling, which llama.cpp's converter writes as a rope_freqs.weight tensor
    "llama-llama3-rope": (
        "llama",
        tf.LlamaConfig,
        tf.LlamaForCausalLM,
        LLAMA_QWEN2["llama-gqa3-llama3-rope"][3],
        "smollm2",
        {},
    ),
}


#: Cases where Metrale and llama.cpp differ on llama.cpp's own file, each with why (strict: a fix
#: turns them into failures until they join CASES).
DIFFERENT = {
    "qwen3moe": (
        # llama.cpp's qwen3moe has no dense layers (see the refusal test): every layer sparse here
        (
            "qwen3moe",
            *MOE["qwen3moe"][:2],
            MOE["qwen3moe"][2]["renorm-mlp-only-layer"],
            "smollm2",
            {"mlp_only_layers": []},
        ),
        "Metrale's own error on the quantized Qwen3-MoE files is several times llama.cpp's: "
        "KL(Metrale on Q8_0 || Metrale on F32) 6.3e-2 where llama.cpp's is 1.7e-2 (exact and the "
        "default format alike; the F32 file agrees to 1.5e-6): to be understood",
    ),
    "phi3-past-original": (
        ("phi3", *DENSE["phi3"][:2], DENSE["phi3"][2]["longrope-gqa"], "smollm2-gpt2", {}),
        "LongRoPE past the original length (16) on a 32-token prompt: llama.cpp picks the long factors "
        "for every position from its context size (as transformers does from the sequence length); "
        "Metrale picks them per position (metrale_core/decoder/rope.py says so)",
    ),
}
ALL = {**CASES, **{name: case for name, (case, _) in DIFFERENT.items()}}


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """kind -> a folder of its files, written on first use."""
    for name in ("met-logits", "llama-quantize", "convert/convert_hf_to_gguf.py"):
        tool(name)  # skip (fail under CI) before any work where the tools are not built
    made: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in made:
            made[kind] = save_tokenizer(kind, tmp_path_factory.mktemp(f"tokenizer-{kind}"))
        return made[kind]

    return get


def _checkpoint(case: str):
    _, config_cls, model_cls, config, kind, overrides = ALL[case]
    config = {**widen({**config, **overrides}, VOCABS[kind]), **SPECIAL_IDS}
    return build_hf(config_cls, model_cls, seed=len(case), **config)


@pytest.mark.parametrize(
    "case",
    sorted(CASES)
    + [pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=why)) for name, (_, why) in DIFFERENT.items()],
)
def test_metrale_matches_llamacpp_on_llamacpps_own_files(case, tokenizers, tmp_path):
    torch.set_num_threads(2)
    loader, kind = ALL[case][0], ALL[case][4]
    run = run_oracle(_checkpoint(case), loader, tokenizers(kind), tmp_path, IDS)
    print("\n" + run.table())
    assert_within_llamacpp_quant_error(run)


def test_llamacpp_cannot_convert_a_qwen3moe_with_dense_layers(tokenizers, tmp_path):
    """The family test's Qwen3-MoE configs have dense layers (``mlp_only_layers``,
    ``decoder_sparse_step``), which llama.cpp's qwen3moe arch lacks: its converter refuses them."""
    _, config_cls, model_cls, config, kind, _ = ALL["qwen3moe"]
    hf = build_hf(config_cls, model_cls, seed=1, **widen(config, VOCABS[kind]), **SPECIAL_IDS)
    with pytest.raises(ConversionRefused, match=r"Can not map tensor 'model\.layers\.1\.mlp\.down_proj\.weight'"):
        run_oracle(hf, "qwen3moe", tokenizers(kind), tmp_path, IDS)
