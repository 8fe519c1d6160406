"""Tensor parallelism of the qwen3 / llama loaders: TP=2 (worker process, gloo on loopback) against
TP=1 through the real engine path -- chunked prefill, batched decode, a forced preemption."""

from __future__ import annotations

import pytest
from qwen3_harness import SMOL_GGUF, build_hf, needs_smol, save_checkpoint
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from metrale_core.api import LoadOptions, ShapeMismatch
from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.loading.load import load_model
from metrale_core.parallel.launch import load_parallel
from metrale_core.sampling import SamplingParams
from metrale_core.testing.tensor_parallel import run_recording
from metrale_core.testing.tp_oracle import assert_tp2_matches_tp1, run_engine, write_word_tokenizer

PROMPTS = [[(7 * i + 3 * j) % 96 + 1 for j in range(9 + 4 * i)] for i in range(4)]

CASES = {
    # Qwen3: QK-norm, GQA 2 KV heads (one per rank), untied head, odd intermediate (split 40 + 40).
    "qwen3": (
        Qwen3Config,
        Qwen3ForCausalLM,
        {
            "vocab_size": 97,
            "hidden_size": 32,
            "intermediate_size": 80,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "tie_word_embeddings": False,
        },
    ),
    # Llama like SmolLM2: 3 KV heads over 2 ranks (2 + 1 groups), tied embedding, biases.
    "llama": (
        LlamaConfig,
        LlamaForCausalLM,
        {
            "vocab_size": 97,
            "hidden_size": 48,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 6,
            "num_key_value_heads": 3,
            "attention_bias": True,
            "mlp_bias": True,
            "tie_word_embeddings": True,
        },
    ),
}


def _checkpoint(name, directory):
    """A random checkpoint of ``CASES[name]`` with a word-level tokenizer (load_model wants one)."""
    config_cls, model_cls, kwargs = CASES[name]
    path = save_checkpoint(build_hf(config_cls, model_cls, seed=5, **kwargs), directory)
    write_word_tokenizer(path, kwargs["vocab_size"])
    return path


def _engine_run(model):
    # 10 blocks of 4 tokens for 4 sequences of up to 33 tokens: a preemption is certain.
    return run_engine(model, PROMPTS, num_kv_blocks=10, max_tokens=12)


@pytest.mark.parametrize("name", sorted(CASES))
def test_tp2_matches_tp1_through_the_engine(name, tmp_path):
    kwargs = CASES[name][2]
    heads = kwargs["num_key_value_heads"]

    def rank0_keeps_its_kv_heads(model):
        assert model.info.kv.num_kv_heads == heads - heads // 2

    path = _checkpoint(name, tmp_path)
    options = LoadOptions(weight_format="exact")
    assert_tp2_matches_tp1(path, options, _engine_run, atol=1e-5, check_split=rank0_keeps_its_kv_heads)


def test_a_split_that_cuts_quantized_blocks_is_refused_naming_the_tensor(tmp_path):
    path = _checkpoint("qwen3", tmp_path)
    # int8 re-quantizes per 32 columns: o_proj's 64 columns split 32 + 32 fine, but down_proj's 80
    # split 40 + 40 would cut a block.
    with pytest.raises(Exception, match=r"down_proj\.weight.*cut its blocks of 32"):
        load_parallel(path, LoadOptions(weight_format="int8"), size=2, backend="mp", threads=1, progress=False)
    assert ShapeMismatch  # the workers' and rank 0's reason is a ShapeMismatch message


CHAT = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Write a haiku about the sea.",
    "What is 12 times 7?",
    "Give me one tip for learning Python.",
]


@needs_smol
def test_smollm2_chat_answers_are_the_same_at_tp2():
    """The embedded SmolLM2 in the default weight format (its Q4_1 / Q8_0 GGUF blocks, split between
    blocks: 3 KV heads as 2 + 1, the MLP as 768 + 768 columns): five greedy chat answers, batched."""
    options = LoadOptions()  # the default format: auto
    single = load_model(SMOL_GGUF, options, progress=False)
    prompts = [single.tokenizer.encode_chat([{"role": "user", "content": c}]) for c in CHAT]
    params = SamplingParams(temperature=0.0, max_tokens=24)
    config = EngineConfig(block_size=16, num_kv_blocks=64, max_prefill_tokens=64, max_num_seqs=8)
    expected = run_recording(LLMEngine(single.model, config, tokenizer=single.tokenizer), prompts, params)
    loaded = load_parallel(SMOL_GGUF, options, size=2, backend="mp", threads=1, progress=False)
    try:
        got = run_recording(LLMEngine(loaded.model, config, tokenizer=loaded.tokenizer), prompts, params)
    finally:
        loaded.model.close()
    assert got.tokens == expected.tokens
    paris = single.tokenizer.decode(got.tokens["r0"])
    assert "Paris" in paris, paris
