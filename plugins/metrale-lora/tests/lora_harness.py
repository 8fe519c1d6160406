"""Test helpers for metrale-lora: random HF bases, random PEFT adapters, an engine that records
the logits of every sampled row.

Owner: ``plugins/metrale-lora/tests``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from metrale_core.api import ADAPTER_EXTRA, LoadOptions, SamplingParams, open_weights
from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.testing.hf_random import eager_model, randomize_
from metrale_lora.engine_setup import enable_adapters
from metrale_lora.peft_format import load_peft

#: The tiny Llama (seed 7) of the llama.cpp LoRA fixtures in data/ (make_gguf_lora.py, test_gguf_lora.py).
GGUF_FIXTURE_BASE = {
    "vocab_size": 96,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}


def random_hf(config_cls, model_cls, seed: int, **kwargs):
    """A random fp32 HF model (eager attention) with every parameter noisy."""
    model = eager_model(config_cls, model_cls, seed, **kwargs)
    randomize_(model, seed)
    return model


def save_adapter(base, directory: Path, seed: int, **lora_kwargs):
    """A PEFT adapter on a copy of ``base`` with random A and B (scaled to move logits), saved to
    ``directory``; returns the PEFT model (the reference)."""
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(init_lora_weights=False, lora_dropout=0.0, **lora_kwargs)
    peft_model = get_peft_model(copy.deepcopy(base), cfg).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))
    peft_model.save_pretrained(directory)
    return peft_model


def load_base(loader: str, directory: Path):
    from metrale_qwen3 import metrale_model_loaders

    specs = {}
    metrale_model_loaders(lambda spec: specs.__setitem__(spec.name, spec))
    return specs[loader].factory(
        open_weights(directory), LoadOptions(dtype="float32", device="cpu", weight_format="exact")
    )


class RecordingEngine:
    """An ``LLMEngine`` with adapters whose sampled logits rows are kept per (request, position)."""

    def __init__(
        self,
        model,
        *,
        max_loras: int = 4,
        max_rank: int = 16,
        block_size: int = 4,
        max_prefill_tokens: int = 64,
        prefix_caching: bool = False,
    ) -> None:
        self.engine = LLMEngine(
            model,
            EngineConfig(
                block_size=block_size,
                num_kv_blocks=256,
                max_prefill_tokens=max_prefill_tokens,
                enable_prefix_caching=prefix_caching,
            ),
        )
        self.bank = enable_adapters(self.engine, max_loras, max_rank, loader=load_peft)
        self.logits: dict[tuple[str, int], torch.Tensor] = {}
        runner = self.engine.runner
        execute = runner.execute

        def recording(plan, **kwargs):
            out = execute(plan, **kwargs)
            if out.logits is not None:
                row = 0
                for chunk in plan.chunks:
                    if chunk.sample:
                        self.logits[(chunk.seq.request_id, chunk.start + chunk.num_tokens - 1)] = out.logits[row]
                        row += 1
            return out

        runner.execute = recording

    def run(self, requests: list[tuple[str, list[int], str | None]], max_tokens: int = 5) -> dict[str, list[int]]:
        """Greedy-generate every ``(request_id, prompt, adapter name or None)`` together;
        returns request id -> prompt + output tokens."""
        for rid, prompt, adapter in requests:
            extras = None if adapter is None else {ADAPTER_EXTRA: self.bank.key_for(adapter)}
            self.engine.add_request(
                rid, prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True), extras=extras
            )
        tokens = {rid: list(prompt) for rid, prompt, _ in requests}
        while self.engine.has_unfinished():
            for out in self.engine.step():
                tokens[out.request_id].extend(out.new_token_ids)
                assert out.finish_reason in (None, "length"), out
        return tokens

    def row_logits(self, rid: str, tokens: list[int], prompt_len: int) -> torch.Tensor:
        return torch.stack([self.logits[(rid, p)] for p in range(prompt_len - 1, len(tokens) - 1)])
