"""The llama.cpp oracle for Gemma 3 (issue 31): a random HF Gemma 3 (the parity test's config with
sliding and global layers, per-type RoPE and a final soft-cap, widened so every matrix row is whole
Q4_K super-blocks; without its attention soft-cap, which Gemma 3 ignores and llama.cpp's converter
refuses -- a test below holds that) converted by llama.cpp's own ``convert_hf_to_gguf.py`` and quantized by its
``llama-quantize`` to Q8_0 and Q4_K_M; Metrale's logits on each file against llama.cpp's on the
same file, within llama.cpp's own quantization error
(``metrale_core.testing.llamacpp_oracle.assert_within_llamacpp_quant_error``; ``pytest -s``
prints the figures).  The checkpoint carries SmolLM2's real tokenizer (without a
``tokenizer.model`` Gemma 3's converter takes its GPT-2 path, which names the tokenizer by a hash).
The tools come from ``scripts/build-llamacpp.sh``; without them the test skips locally and fails
under ``CI=true``.
"""

from __future__ import annotations

import gemma3_harness as H
import pytest
import torch

from metrale_core.testing.llamacpp import ConversionRefused, tool
from metrale_core.testing.llamacpp_oracle import assert_within_llamacpp_quant_error, run_oracle, save_tokenizer, widen
from metrale_core.testing.smollm2 import CAPITAL_CHAT_IDS, VOCAB_SIZE

pytestmark = pytest.mark.slow
IDS = list(CAPITAL_CHAT_IDS[:32])
NAME = "window6-softcap"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    for name in ("met-logits", "llama-quantize", "convert/convert_hf_to_gguf.py"):
        tool(name)  # skip (fail under CI) before any work where the tools are not built
    return save_tokenizer("smollm2", tmp_path_factory.mktemp("tokenizer"))


def test_metrale_matches_llamacpp_on_llamacpps_own_gemma3_files(tokenizer, tmp_path):
    torch.set_num_threads(2)
    config = widen({**H.CONFIGS[NAME], "attn_logit_softcapping": None}, VOCAB_SIZE)
    run = run_oracle(H.make_hf_model(NAME, seed=3, config=config), "gemma3", tokenizer, tmp_path, IDS)
    print("\n" + run.table())
    assert_within_llamacpp_quant_error(run)


def test_llamacpp_cannot_convert_a_gemma3_with_an_attention_softcap(tokenizer, tmp_path):
    """transformers' Gemma 3 reads and ignores ``attn_logit_softcapping``; llama.cpp's converter
    asserts it is unset."""
    hf = H.make_hf_model(NAME, seed=3, config=widen(H.CONFIGS[NAME], VOCAB_SIZE))
    with pytest.raises(ConversionRefused, match=r"attn_logit_softcapping.*AssertionError"):
        run_oracle(hf, "gemma3", tokenizer, tmp_path, IDS)
