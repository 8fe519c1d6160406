"""The real SmolLM2-135M-Instruct Q4_1 GGUF through the llama loader: reference ids of models.md."""

from __future__ import annotations

import pytest
import torch
from qwen3_harness import SMOL_GGUF as GGUF
from qwen3_harness import PagedRunner, load, needs_smol

from metrale_core.testing.smollm2 import CAPITAL_CHAT_IDS
from metrale_core.weights import open_weights

CHAT_PROMPT = list(CAPITAL_CHAT_IDS)

pytestmark = [
    pytest.mark.slow,
    needs_smol,
]


def test_smollm2_matches_hf_reference_outputs():
    torch.set_num_threads(2)
    model = load("llama", open_weights(GGUF))
    assert model.info.architecture == "llama" and model.info.vocab_size == 49152
    assert model.weights.lm_head is model.weights.embed  # no output.weight: tied
    runner = PagedRunner(model, num_blocks=32, block_size=16)
    # Raw "Once upon a time" (prefilled in one chunk) batched with the chat prompt's first chunk.
    last = runner.step([(0, [6403, 1980, 253, 655]), (1, CHAT_PROMPT[:20])])
    top = last[0].topk(5)
    assert top.indices.tolist() == [28, 281, 665, 260, 253]
    torch.testing.assert_close(top.values, torch.tensor([18.142, 14.083, 13.367, 12.936, 12.928]), rtol=0, atol=2e-3)
    last = runner.step([(0, [28]), (1, CHAT_PROMPT[20:])])
    new_ids = []
    for _ in range(8):
        new_ids.append(int(last[1].argmax()))
        last = runner.step([(0, [int(last[0].argmax())]), (1, [new_ids[-1]])])
    assert new_ids == [504, 3575, 282, 4649, 314, 7042, 30, 2]  # "The capital of France is Paris.<|im_end|>"
