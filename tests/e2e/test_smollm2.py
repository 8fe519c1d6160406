"""The real embedded model, SmolLM2-135M-Instruct Q4_1, against the reference ids of
``reference/models.md`` (HF transformers 5.23, fp32 dequantized, greedy)."""

from __future__ import annotations

import pytest
import torch

from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.sampling.params import SamplingParams
from metrale_core.testing.smollm2 import CAPITAL_CHAT_IDS

CHAT_PROMPT_IDS = list(CAPITAL_CHAT_IDS)
CHAT_NEW_IDS = [504, 3575, 282, 4649, 314, 7042, 30, 2]


@pytest.fixture(scope="module")
def smollm2():
    from metrale_core.loading.embedded import default_model_path
    from metrale_core.loading.load import load_model

    return load_model(default_model_path(progress=False), progress=False)


def _run(loaded, prompts, params, **cfg):
    engine = LLMEngine(loaded.model, EngineConfig(**cfg), tokenizer=loaded.tokenizer)
    outs = {f"r{i}": [] for i in range(len(prompts))}
    texts = {f"r{i}": "" for i in range(len(prompts))}
    for i, ids in enumerate(prompts):
        engine.add_request(f"r{i}", ids, params)
    while engine.has_unfinished():
        for out in engine.step():
            outs[out.request_id].extend(out.new_token_ids)
            texts[out.request_id] += out.text_delta
    return outs, texts


def test_chat_prompt_ids_match_reference(smollm2):
    tok = smollm2.tokenizer
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True
    )
    assert tok.encode(rendered, add_special_tokens=False) == CHAT_PROMPT_IDS


def test_greedy_chat_reproduces_reference_ids(smollm2):
    outs, texts = _run(
        smollm2, [CHAT_PROMPT_IDS], SamplingParams(temperature=0.0, max_tokens=32), block_size=16, num_kv_blocks=16
    )
    assert outs["r0"] == CHAT_NEW_IDS
    assert texts["r0"] == "The capital of France is Paris."


def test_once_upon_a_time_next_token_logits(smollm2):
    class Capture:
        def __init__(self, model):
            self.model, self.info, self.last = model, model.info, None

        def make_state_pool(self, n):
            return self.model.make_state_pool(n)

        def forward(self, batch, kv, state=None):
            self.last = self.model.forward(batch, kv, state)
            return self.last

    ids = smollm2.tokenizer.encode("Once upon a time", add_special_tokens=True)
    assert ids == [6403, 1980, 253, 655]
    capture = Capture(smollm2.model)
    engine = LLMEngine(capture, EngineConfig(block_size=16, num_kv_blocks=8))
    engine.add_request("r0", ids, SamplingParams(temperature=0.0, max_tokens=1))
    while engine.has_unfinished():
        engine.step()
    top = torch.topk(capture.last[0], 5)
    assert top.indices.tolist() == [28, 281, 665, 260, 253]
    assert torch.allclose(top.values, torch.tensor([18.142, 14.083, 13.367, 12.936, 12.928]), atol=2e-3)


def test_batched_chunked_generation_equals_alone(smollm2):
    tok = smollm2.tokenizer
    prompts = [
        tok.encode(t) for t in ("Once upon a time", "The three primary colors are", "def fibonacci(n):", "Paris is")
    ]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    together, _ = _run(smollm2, prompts, params, block_size=8, num_kv_blocks=64, max_prefill_tokens=5)
    for i, ids in enumerate(prompts):
        alone, _ = _run(smollm2, [ids], params, block_size=16, num_kv_blocks=16)
        assert together[f"r{i}"] == alone["r0"]
