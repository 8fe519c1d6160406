"""LoRA logits parity with PEFT through the engine path (``weight_format="exact"``, fp32, <= 1e-4),
and batch isolation: a step mixing base rows and three adapters gives each row its solo result
(the same tokens, and logits equal up to the fp32 matmul's dependence on the batch's row count,
which base rows show too: ~1e-6 on this CPU)."""

from __future__ import annotations

import pytest
import torch
from lora_harness import RecordingEngine, load_base, random_hf, save_adapter
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

PROMPTS = [
    [3, 9, 27, 81, 50, 6, 18],
    [70, 2, 2, 45, 13, 99, 31, 8, 77, 5, 40],
    [61, 22],
    [14, 28, 56, 19, 38, 76, 59, 24, 48],
]

BASES = {
    "qwen3": (
        Qwen3Config,
        Qwen3ForCausalLM,
        {
            "vocab_size": 100,
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "rope_theta": 10000.0,
            "tie_word_embeddings": False,
        },
    ),
    "llama": (
        LlamaConfig,
        LlamaForCausalLM,
        {
            "vocab_size": 100,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "attention_bias": True,
            "mlp_bias": True,
            "rope_theta": 100000.0,
            "tie_word_embeddings": True,
        },
    ),
}
#: Two ranks, different target modules (attention only, MLP only, everything), one rsLoRA.
ADAPTERS = {
    "attn-r8": {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj", "o_proj"]},
    "mlp-r4": {"r": 4, "lora_alpha": 8, "target_modules": ["gate_proj", "down_proj"]},
    "all-rs": {
        "r": 8,
        "lora_alpha": 4,
        "use_rslora": True,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    },
}


@pytest.fixture(scope="module", params=sorted(BASES))
def setup(request, tmp_path_factory):
    name = request.param
    config_cls, model_cls, kwargs = BASES[name]
    root = tmp_path_factory.mktemp(name)
    hf = random_hf(config_cls, model_cls, seed=len(name), **kwargs)
    hf.save_pretrained(root / "base")
    refs = {a: save_adapter(hf, root / a, seed=i + 1, **cfg) for i, (a, cfg) in enumerate(ADAPTERS.items())}
    return name, hf, refs, root


@torch.no_grad()
def _reference(model, tokens: list[int], prompt_len: int) -> torch.Tensor:
    return model(torch.tensor([tokens])).logits[0, prompt_len - 1 : len(tokens) - 1].float()


def _engine(setup) -> RecordingEngine:
    name, _, _, root = setup
    rec = RecordingEngine(load_base(name, root / "base"))
    for a in ADAPTERS:
        rec.bank.load(a, str(root / a))
    return rec


def test_each_adapter_matches_peft_and_base_rows_match_hf(setup):
    _, hf, refs, _ = setup
    rec = _engine(setup)
    requests = [(f"{a or 'base'}-{i}", p, a) for i, p in enumerate(PROMPTS) for a in (None, *ADAPTERS)]
    tokens = rec.run(requests, max_tokens=5)
    for rid, prompt, adapter in requests:
        ref_model = hf if adapter is None else refs[adapter]
        ref = _reference(ref_model, tokens[rid], len(prompt))
        ours = rec.row_logits(rid, tokens[rid], len(prompt))
        assert (ours - ref).abs().max() <= 1e-4, (rid, float((ours - ref).abs().max()))
    # the adapters really change the outputs (the test can fail)
    base = rec.row_logits("base-0", tokens["base-0"], len(PROMPTS[0]))
    for a in ADAPTERS:
        assert (rec.row_logits(f"{a}-0", tokens[f"{a}-0"], len(PROMPTS[0])) - base).abs().max() > 1e-2


def test_mixed_batch_rows_equal_their_solo_runs(setup):
    rec = _engine(setup)
    mixed = [(f"{a or 'base'}-{i}", p, a) for i, p in enumerate(PROMPTS[:2]) for a in (None, *ADAPTERS)]
    tokens = rec.run(mixed, max_tokens=4)
    mixed_logits = {rid: rec.row_logits(rid, tokens[rid], len(p)) for rid, p, _ in mixed}
    for rid, prompt, adapter in mixed:  # the same engine, one request at a time
        solo_tokens = rec.run([("solo-" + rid, prompt, adapter)], max_tokens=4)
        assert solo_tokens["solo-" + rid] == tokens[rid]
        torch.testing.assert_close(
            rec.row_logits("solo-" + rid, tokens[rid], len(prompt)), mixed_logits[rid], rtol=0, atol=5e-6
        )
